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

/// Runs fn and expects an ArgumentError of `op` for `arg` (its message holding `also` when given).
inline void expect_op_arg_error(const std::function<void()>& fn, const std::string& op, const std::string& arg,
                                const std::string& also = "") {
  try {
    fn();
    ADD_FAILURE() << "no error; expected ArgumentError for '" << arg << "'";
  } catch (const lowbit::ArgumentError& e) {
    const std::string w = e.what();
    EXPECT_EQ(e.op(), op) << w;
    EXPECT_EQ(e.arg(), arg) << w;
    if (!also.empty()) EXPECT_NE(w.find(also), std::string::npos) << w;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type for '" << arg << "': " << e.what();
  }
}

/// Runs fn and expects an ArgumentError for `arg` whose message names it ("argument 'arg'") and
/// holds `also` when given.
inline void expect_named_arg_error(const std::function<void()>& fn, const std::string& arg,
                                   const std::string& also = "") {
  try {
    fn();
    ADD_FAILURE() << "no error; expected ArgumentError for '" << arg << "'";
  } catch (const lowbit::ArgumentError& e) {
    const std::string w = e.what();
    EXPECT_EQ(e.arg(), arg) << w;
    EXPECT_NE(w.find("argument '" + arg + "'"), std::string::npos) << w;
    if (!also.empty()) EXPECT_NE(w.find(also), std::string::npos) << w;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

}  // namespace argtest
