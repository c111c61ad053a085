#include "engine/stop_strings.h"

#include <gtest/gtest.h>

#include <random>

#include "util/error.h"

namespace qs {
namespace {

struct Streamed {
  std::string text;  // everything emitted, including what finish() released
  std::optional<size_t> stopped_by;
};

Streamed stream(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopStringMatcher m(stops);
  Streamed out;
  for (const std::string& piece : pieces) {
    StopScan scan = m.push(piece);
    out.text += scan.text;
    if (scan.stopped_by) {
      out.stopped_by = scan.stopped_by;
      break;
    }
  }
  out.text += m.finish();
  return out;
}

// What streaming must produce, computed on the whole text: cut at the stop string completed first.
Streamed reference(const std::vector<std::string>& stops, const std::string& text) {
  for (size_t end = 1; end <= text.size(); ++end)
    for (size_t len = end; len >= 1; --len)  // on a tie, the match that starts first
      for (size_t s = 0; s < stops.size(); ++s)
        if (stops[s].size() == len && text.compare(end - len, len, stops[s]) == 0)
          return {text.substr(0, end - len), s};
  return {text, std::nullopt};
}

}  // namespace

TEST(StopStrings, NoStopStringsPassEverythingThrough) {
  StopStringMatcher m({});
  EXPECT_EQ(m.push("Hello").text, "Hello");
  EXPECT_EQ(m.push(", world").text, ", world");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.finish(), "");
}

TEST(StopStrings, NoMatchEmitsAllButAPossibleStart) {
  StopStringMatcher m({"</end>"});
  EXPECT_EQ(m.push("a < b").text, "a < b");  // '<' followed by ' ' cannot start "</end>"
  StopScan scan = m.push(" and c </e");
  EXPECT_EQ(scan.text, " and c ");  // "</e" could still become "</end>"
  EXPECT_EQ(m.held(), "</e");
  EXPECT_EQ(m.push("x").text, "</ex");  // it did not
  EXPECT_EQ(m.finish(), "");
}

TEST(StopStrings, StopSplitAcrossTwoPieces) {
  Streamed s = stream({"<END>"}, {"Hello <E", "ND> trailing text"});
  EXPECT_EQ(s.text, "Hello ");
  EXPECT_EQ(s.stopped_by, 0u);
}

TEST(StopStrings, StopSplitAcrossThreePieces) {
  StopStringMatcher m({"Observation:"});
  EXPECT_EQ(m.push("Thought: done\nObs").text, "Thought: done\n");
  EXPECT_EQ(m.push("erva").text, "");
  StopScan last = m.push("tion: 42");
  EXPECT_EQ(last.text, "");
  EXPECT_EQ(last.stopped_by, 0u);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more").text, "");  // ignored after the stop
  EXPECT_EQ(m.finish(), "");
}

TEST(StopStrings, StopAtTheVeryStart) {
  Streamed s = stream({"STOP"}, {"STOP", "after"});
  EXPECT_EQ(s.text, "");
  EXPECT_EQ(s.stopped_by, 0u);
  EXPECT_EQ(stream({"\n\n"}, {"\n", "\nText"}).text, "");
}

TEST(StopStrings, StopInsideOnePieceDropsTheRestOfIt) {
  Streamed s = stream({"###"}, {"ab###cd"});
  EXPECT_EQ(s.text, "ab");
}

TEST(StopStrings, HeldTextIsReleasedWhenGenerationEndsOtherwise) {
  Streamed s = stream({"###"}, {"a#", "#"});
  EXPECT_EQ(s.text, "a##");
  EXPECT_FALSE(s.stopped_by);
}

TEST(StopStrings, OverlappingStopsTheOneCompletedFirstWins) {
  // "bc" is complete at byte 3, "abcd" only at byte 4: byte-by-byte streaming stops at "bc", so every split must.
  for (const auto& pieces :
       std::vector<std::vector<std::string>>{{"abcd"}, {"ab", "cd"}, {"abc", "d"}, {"a", "b", "c", "d"}}) {
    Streamed s = stream({"abcd", "bc"}, pieces);
    EXPECT_EQ(s.text, "a");
    EXPECT_EQ(s.stopped_by, 1u);
  }
  // Same end: the longer one (earlier start) wins.
  Streamed s = stream({"bc", "abc"}, {"xa", "bc"});
  EXPECT_EQ(s.text, "x");
  EXPECT_EQ(s.stopped_by, 1u);
  // Self-overlapping stop string: "aab" inside "aaab".
  EXPECT_EQ(stream({"aab"}, {"a", "a", "a", "b"}).text, "a");
}

TEST(StopStrings, MultiByteUtf8StopSplitInsideACharacter) {
  const std::string stop = "\xE3\x80\x82";  // "。" (3 bytes)
  Streamed s = stream({stop}, {"終わり\xE3", "\x80", "\x82続き"});
  EXPECT_EQ(s.text, "終わり");
  EXPECT_EQ(s.stopped_by, 0u);
}

TEST(StopStrings, RejectsEmptyStopString) { EXPECT_THROW(StopStringMatcher({"ok", ""}), Error); }

// Random texts over a small alphabet, random stop lists and random splits: streaming equals the whole-text rule.
TEST(StopStrings, AnySplitMatchesTheWholeTextReference) {
  std::mt19937 gen(1234);
  auto random_string = [&](size_t min_len, size_t max_len) {
    std::string s(std::uniform_int_distribution<size_t>(min_len, max_len)(gen), 'a');
    for (char& c : s) c = "abc"[std::uniform_int_distribution<int>(0, 2)(gen)];
    return s;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> stops;
    for (int i = std::uniform_int_distribution<int>(0, 3)(gen); i > 0; --i) stops.push_back(random_string(1, 4));
    std::string text = random_string(0, 24);
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      size_t len = std::uniform_int_distribution<size_t>(0, 5)(gen);  // empty pieces too
      pieces.push_back(text.substr(at, len));
      at += len;
    }
    Streamed got = stream(stops, pieces), want = reference(stops, text);
    ASSERT_EQ(got.text, want.text) << "text " << text << " trial " << trial;
    ASSERT_EQ(got.stopped_by, want.stopped_by) << "text " << text << " trial " << trial;
  }
}

}  // namespace qs
