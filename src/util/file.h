#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace qs {

// The whole file as bytes; throws qs::Error naming the path when it cannot be read.
std::string read_file(const std::filesystem::path& path);

// Drops this process's pages of a read-only file mapping within [p, p + n) (whole pages inside the range only):
// resident memory falls, the page cache keeps them, and a later read faults them back in.
void drop_mapped_pages(const std::byte* p, uint64_t n);

}  // namespace qs
