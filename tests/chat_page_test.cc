// The chat page `serve` answers on GET / is compiled in as written, and names no other origin (nothing is fetched
// from elsewhere; tests/server/test_chat_page.py checks the same in Chromium, with the server's CSP).
#include "server/chat_page.h"

#include <gtest/gtest.h>

#include <string>

#include "util/file.h"

namespace qs {
namespace {

TEST(ChatPage, IsTheSourceFileCompiledIn) {
  EXPECT_EQ(chat_page_html(), read_file(std::string(QATSERVE_SOURCE_DIR) + "/src/server/chat_page.html"));
}

TEST(ChatPage, NamesNoOtherOrigin) {
  const std::string_view page = chat_page_html();
  for (std::string_view scheme : {"http://", "https://", "src=\"//", "href=\"//", "url("})
    EXPECT_EQ(page.find(scheme), std::string_view::npos) << scheme;
}

}  // namespace
}  // namespace qs
