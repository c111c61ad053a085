#pragma once
#include <filesystem>
#include <string>

namespace qs {

// The whole file as bytes; throws qs::Error naming the path when it cannot be read.
std::string read_file(const std::filesystem::path& path);

}  // namespace qs
