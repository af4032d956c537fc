// src/core/plan.hpp: validated, device-friendly descriptions of one call, produced by the API
// layer (src/api) and consumed by the CPU reference (src/ref) and the CUDA launchers (src/cuda).
// Everything here has already been checked: implementations trust it. One header per family,
// all included here:
//   plan_formats.hpp    ScalePlan, QuantPlan, DequantPlan, TranscodePlan, CastPlan, LayoutPlan,
//                       the scalar loads / stores
//   plan_kcache.hpp     KCachePlan
//   plan_gemm.hpp       DualGemmPlan
//   plan_moe.hpp        GroupGemmPlan (also the dense mxfp4_gemm), Mxfp4PackPlan, MoeMlpPlan
//   plan_linear.hpp     Nvfp4GemmPlan
//   plan_attention.hpp  AttnMxfp8Plan
//   plan_decode.hpp     DecodeNf4Plan, KprojRopePlan, KCacheAppendPlan
#pragma once

#include "core/plan_attention.hpp"
#include "core/plan_decode.hpp"
#include "core/plan_formats.hpp"
#include "core/plan_gemm.hpp"
#include "core/plan_kcache.hpp"
#include "core/plan_linear.hpp"
#include "core/plan_moe.hpp"
