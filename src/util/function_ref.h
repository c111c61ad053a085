#pragma once
// A callable borrowed for the length of one call: no copy and no allocation, unlike std::function, whose small
// buffer holds two captured references at most (the hot loops pass lambdas that capture more, once per layer).
#include <utility>

namespace qs {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F>
  FunctionRef(const F& f)  // NOLINT: implicit, as std::function's
      : object_(&f), call_([](const void* o, Args... a) -> R { return (*static_cast<const F*>(o))(std::forward<Args>(a)...); }) {}
  R operator()(Args... a) const { return call_(object_, std::forward<Args>(a)...); }

 private:
  const void* object_;
  R (*call_)(const void*, Args...);
};

}  // namespace qs
