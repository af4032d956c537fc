// lowbit/error.hpp: the typed errors thrown by the C++ API (host only).
//
// Every argument check names the argument and what was expected, e.g.
//   lowbit::ArgumentError: quantize: argument 'x': expected dtype float32, float16 or bfloat16, got uint8
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lowbit {

/// Base class of every error lowbit throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller passed an argument that does not satisfy the documented contract.
class ArgumentError : public Error {
 public:
  ArgumentError(const std::string& op, const std::string& arg, const std::string& what)
      : Error(op + ": argument '" + arg + "': " + what), op_(op), arg_(arg) {}
  const std::string& op() const noexcept { return op_; }
  const std::string& arg() const noexcept { return arg_; }

 private:
  std::string op_, arg_;
};

/// The requested operation exists but not on this build or device (e.g. no CUDA).
class NotSupportedError : public Error {
 public:
  using Error::Error;
};

/// A CUDA runtime call or kernel launch failed.
class CudaError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Ts>
std::string concat(const Ts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

}  // namespace lowbit

/// Throws lowbit::ArgumentError(op, arg, message...) unless cond holds.
#define LOWBIT_ARG_CHECK(cond, op, arg, ...)                                          \
  do {                                                                                \
    if (!(cond)) throw ::lowbit::ArgumentError((op), (arg), ::lowbit::detail::concat(__VA_ARGS__)); \
  } while (0)

/// Internal invariant (a bug in lowbit if it fires).
#define LOWBIT_ASSERT(cond)                                                                  \
  do {                                                                                       \
    if (!(cond))                                                                             \
      throw ::lowbit::Error(::lowbit::detail::concat(__FILE__, ":", __LINE__, ": internal check failed: ", #cond)); \
  } while (0)
