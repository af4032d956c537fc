// src/cuda/launch.hpp: the launchers' declarations live in cuda/common/launch.hpp; this path is
// kept for the C++ API sources that include it.
#pragma once

#include "cuda/common/launch.hpp"
