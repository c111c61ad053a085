#pragma once
// One exception type for every user-facing failure: the message names the file, tensor, field or parameter
// and says what was expected, so the command line can print it as is and exit non-zero.
#include <stdexcept>
#include <string>

namespace qs {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace qs
