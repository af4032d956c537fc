// src/cuda/selftest.hpp: the self-test declarations live in cuda/common/selftest.hpp; this path
// is kept for the GPU tests that include it.
#pragma once

#include "cuda/common/selftest.hpp"
