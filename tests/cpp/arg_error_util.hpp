// tests/cpp/arg_error_util.hpp: the check of the argument-validation tests (test_api.cpp,
// test_api_hardening.cpp, test_attention_api.cpp, test_decode_attention_api.cpp) that a call is
// refused with lowbit::ArgumentError naming the argument; each test adds its own check that no
// output was written.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>

#include "lowbit/error.hpp"

namespace argtest {

/// Runs fn and expects an ArgumentError for `arg` whose message names it ("argument 'arg'"), of
/// `op` when one is given, its message holding `also` when given.
inline void expect_arg_error(const std::function<void()>& fn, const std::string& arg, const std::string& also = "",
                             const std::string& op = "") {
  try {
    fn();
    ADD_FAILURE() << "no error; expected ArgumentError for '" << arg << "'";
  } catch (const lowbit::ArgumentError& e) {
    const std::string w = e.what();
    if (!op.empty()) EXPECT_EQ(e.op(), op) << w;
    EXPECT_EQ(e.arg(), arg) << w;
    EXPECT_NE(w.find("argument '" + arg + "'"), std::string::npos) << w;
    if (!also.empty()) EXPECT_NE(w.find(also), std::string::npos) << w;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type for '" << arg << "': " << e.what();
  }
}

}  // namespace argtest
