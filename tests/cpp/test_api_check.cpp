// Checker::require (a declarative tensor requirement) reports the first failure with the message
// of the single check it stands for, in the order present, dtype, rank, shape, element count,
// last-dimension contiguity, contiguity.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "api/check.hpp"

using namespace lowbit;
using namespace lowbit::detail;

namespace {

/// The message `f` throws as ArgumentError ("" when it does not throw).
std::string message(const std::function<void(Checker&)>& f) {
  Checker c{"op"};
  try {
    f(c);
  } catch (const ArgumentError& e) {
    return e.what();
  }
  return "";
}

float buf[64];

TensorView mat(DType t, std::initializer_list<int64_t> dims, std::initializer_list<int64_t> strides) {
  return TensorView(buf, t, dims, strides);
}

}  // namespace

TEST(ApiCheck, RequireMatchesTheSingleChecks) {
  const DTypes floats = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  const std::vector<TensorView> cases = {
      TensorView(),                                          // absent
      mat(DType::kInt32, {4, 8}, {8, 1}),                    // dtype
      mat(DType::kFloat32, {2, 2, 2, 2}, {8, 4, 2, 1}),      // rank
      mat(DType::kFloat32, {4, 7}, {7, 1}),                  // shape
      mat(DType::kFloat32, {4, 8}, {1, 4}),                  // last dimension strided
      mat(DType::kFloat32, {4, 8}, {16, 1}),                 // not contiguous
      mat(DType::kFloat32, {4, 8}, {8, 1}),                  // fine
  };
  for (const TensorView& t : cases) {
    const std::string chain = message([&](Checker& c) {
      c.present(t, "x");
      c.dtype(t, "x", floats);
      if (t.ndim < 2 || t.ndim > 3) c.fail("x", "expected [M, K], got " + t.describe());
      c.shape(t, "x", {4, 8});
      c.last_contiguous(t, "x");
      if (!t.is_contiguous()) c.fail("x", "packed weights must be contiguous, got " + t.describe());
    });
    const std::string req = message([&](Checker& c) {
      c.require(t, Req("x").dtypes(floats).rank(2, 3, "[M, K]").shape({4, 8}).last_contiguous().contiguous("packed weights"));
    });
    EXPECT_EQ(req, chain) << t.describe();
  }
  EXPECT_EQ(message([](Checker& c) { c.require(TensorView(), Req("x")); }), "op: argument 'x': is required");
}

TEST(ApiCheck, RequireOneElementAndMatrix) {
  const TensorView two = mat(DType::kFloat32, {2}, {1});
  EXPECT_EQ(message([&](Checker& c) { c.require(two, Req("amax").one_element("one element")); }),
            "op: argument 'amax': expected one element, got " + two.describe());
  const TensorView v = mat(DType::kFloat32, {8}, {1});
  EXPECT_EQ(message([&](Checker& c) { c.require(v, Req("x").matrix()); }),
            message([&](Checker& c) { as_mat(c, v, "x"); }));
  EXPECT_EQ(message([&](Checker& c) { c.require(v, Req("x").matrix()); }),
            "op: argument 'x': expected a 2-D [M, K] or 3-D [L, M, K] tensor, got " + v.describe());
}

TEST(ApiCheck, RequireTracksTheDevice) {
  const TensorView a(buf, DType::kFloat32, {4}, Device::kCUDA, 1);
  const TensorView b(buf, DType::kFloat32, {4});
  const std::string m = message([&](Checker& c) {
    c.require(a, Req("a"));
    c.require(b, Req("b"));
  });
  EXPECT_EQ(m, "op: argument 'b': must be on the same device as the first tensor (cuda:1), got " + b.describe());
}

TEST(ApiCheck, DTypeListsReadAsBefore) {
  const TensorView t = mat(DType::kInt32, {4}, {1});
  EXPECT_EQ(message([&](Checker& c) { c.require(t, Req("q").dtypes(code_dtypes(BlockFormat::mxfp4()))); }),
            "op: argument 'q': expected dtype uint8 or float4_e2m1fn_x2, got int32");
  EXPECT_EQ(message([&](Checker& c) { c.require(t, Req("s").dtypes(scale_dtypes(ScaleType::kE4M3))); }),
            "op: argument 's': expected dtype float8_e4m3fn or uint8, got int32");
  EXPECT_EQ(message([&](Checker& c) { c.require(t, Req("s").dtypes(scale_dtypes(ScaleType::kF32))); }),
            "op: argument 's': expected dtype float32, got int32");
}
