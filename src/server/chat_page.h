#pragma once
// The chat page `qatserve serve` answers on GET / (unless --no-ui): one self-contained HTML document (styles and
// script inline, nothing fetched from elsewhere) that talks to this server's /v1/models and /v1/chat/completions.
// Its source is src/server/chat_page.html; CMake compiles it in.
#include <string_view>

namespace qs {

std::string_view chat_page_html();

}  // namespace qs
