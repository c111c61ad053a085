// The documents against the software they describe:
// - docs/commands.md names every command and flag the qatserve binary has (its `help` and `COMMAND --help`), and
//   every `qatserve COMMAND` and `--flag` it names exists in the binary;
// - docs/api.md's route table is exactly the routes the server answers (src/server/routes.cc), and every
//   "METHOD /path" it mentions is served;
// - README.md, BENCHMARKS.md and docs/ name no path of one particular machine or run, and their relative links
//   reach a file and, with #anchor, one of its headings.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "server/routes.h"
#include "test_util.h"

namespace qs {
namespace {

namespace fs = std::filesystem;
using test::CliResult;
using test::qatserve;
const fs::path kSource = QATSERVE_SOURCE_DIR;

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in) << "cannot read " << p;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::set<std::string> all_matches(const std::string& text, const std::regex& re, int group = 1) {
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it)
    out.insert((*it)[group].str());
  return out;
}

// ---- commands and flags ----

// The subcommands `qatserve help` lists: the lines after CLI11's "SUBCOMMANDS:" heading, up to a blank line.
std::set<std::string> binary_commands() {
  const CliResult r = qatserve("help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> out;
  bool in_list = false;
  const std::regex entry(R"(^\s+([a-z][a-z0-9-]*)\s)");
  for (const std::string& line : lines_of(r.output)) {
    if (std::regex_search(line, std::regex("^subcommands:", std::regex::icase))) {
      in_list = true;
    } else if (in_list && line.empty()) {
      in_list = false;
    } else if (std::smatch m; in_list && std::regex_search(line, m, entry)) {
      out.insert(m[1]);
    }
  }
  EXPECT_FALSE(out.empty()) << "no SUBCOMMANDS list in `qatserve help`:\n" << r.output;
  return out;
}

// The long flags in CLI11's option column of a --help text (a line that starts with two spaces and a dash), never
// flags that a description mentions (serve's --kv-memory help names `plan --device`).
std::set<std::string> option_column_flags(const std::string& help) {
  std::set<std::string> out;
  const std::regex option_column(R"(^  (-[^ ]+))");
  const std::regex long_flag(R"((--[a-z0-9][a-z0-9-]*))");
  for (const std::string& line : lines_of(help)) {
    std::smatch m;
    if (!std::regex_search(line, m, option_column)) continue;
    for (const std::string& f : all_matches(m[1].str(), long_flag)) out.insert(f);
  }
  return out;
}

std::set<std::string> binary_flags(const std::string& command) {
  const CliResult r = qatserve(command + " --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return option_column_flags(r.output);
}

// The text of docs/commands.md from the heading "### `qatserve COMMAND`" to the next heading.
std::string options_section(const std::string& doc, const std::string& command) {
  const std::string heading = "### `qatserve " + command + "`\n";
  const size_t at = doc.find(heading);
  if (at == std::string::npos) return "";
  const size_t end = doc.find("\n#", at + heading.size());
  return doc.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

// Flags docs/commands.md may name that belong to other programs, not to qatserve.
const std::set<std::string> kOtherProgramsFlags = {
    "--mmproj",  // llama.cpp's convert_hf_to_gguf.py, which reads synth's processor_config.json
};

TEST(Docs, CommandsAndFlagsMatchTheBinary) {
  const std::string doc = read_text(kSource / "docs/commands.md");
  const std::set<std::string> commands = binary_commands();
  std::set<std::string> every_flag;
  for (const std::string& command : commands) {
    const std::string section = options_section(doc, command);
    EXPECT_FALSE(section.empty()) << "docs/commands.md has no section \"### `qatserve " << command
                                  << "`\" under \"Options of every command\" (run "
                                  << "tools/python/update_command_help.py build/qatserve)";
    const std::set<std::string> flags = binary_flags(command), documented = option_column_flags(section);
    every_flag.insert(flags.begin(), flags.end());
    for (const std::string& flag : flags)
      EXPECT_TRUE(documented.count(flag))
          << "`qatserve " << command << " " << flag << "` is not in docs/commands.md's section for " << command
          << " (run tools/python/update_command_help.py build/qatserve)";
    for (const std::string& flag : documented)
      EXPECT_TRUE(flags.count(flag)) << "docs/commands.md's section for " << command << " names " << flag
                                     << ", which `qatserve " << command << " --help` does not have";
  }
  for (const std::string& flag : all_matches(doc, std::regex(R"((?:^|[^a-z0-9-])(--[a-z0-9][a-z0-9-]*))")))
    EXPECT_TRUE(every_flag.count(flag) || kOtherProgramsFlags.count(flag))
        << "docs/commands.md names " << flag << ", which no qatserve command has";
  for (const std::string& command : all_matches(doc, std::regex(R"(`qatserve ([a-z][a-z0-9-]*))")))
    EXPECT_TRUE(commands.count(command)) << "docs/commands.md names `qatserve " << command
                                         << "`, which `qatserve help` does not list";
}

// ---- routes ----

// "METHOD /path" -> the path route_of is asked for ({id} becomes a sample id).
Route route_of_entry(const std::string& entry) {
  const size_t space = entry.find(' ');
  std::string path = entry.substr(space + 1);
  if (const size_t id = path.find("{id}"); id != std::string::npos) path.replace(id, 4, "resp_0123");
  return route_of(entry.substr(0, space), path, /*ui=*/true);
}

TEST(Docs, RoutesMatchTheServer) {
  const std::string doc = read_text(kSource / "docs/api.md");
  // The route table: rows that start with "| `METHOD /path`".
  const std::set<std::string> documented =
      all_matches(doc, std::regex(R"((?:^|\n)\| `((?:GET|POST|DELETE|PUT|PATCH) /[^`]*)`)"));
  const std::vector<std::string> served = served_routes();
  for (const std::string& r : served) {
    EXPECT_TRUE(documented.count(r)) << "the server answers " << r << " but docs/api.md's route table lacks it";
    const Route route = route_of_entry(r);
    EXPECT_NE(route, Route::NotFound) << r;
    EXPECT_NE(route, Route::MethodNotAllowed) << r;
  }
  const std::set<std::string> served_set(served.begin(), served.end());
  for (const std::string& r : documented)
    EXPECT_TRUE(served_set.count(r)) << "docs/api.md's route table lists " << r << ", which the server does not serve";
  // Every "METHOD /path" the text mentions is served (the path up to a quote, bracket, space or comma).
  for (const std::string& r : all_matches(doc, std::regex(R"(\b((?:GET|POST|DELETE|PUT|PATCH) /[^\s`'"),]*))"))) {
    const Route route = route_of_entry(r);
    EXPECT_TRUE(route != Route::NotFound && route != Route::MethodNotAllowed)
        << "docs/api.md mentions " << r << ", which the server does not serve";
  }
}

// ---- machine-local paths ----

// A path names one machine or one run when it starts at a home or work folder (/work/, /home/, /root/, /Users/,
// /mnt/, /scratch/, /dev/shm/), or is a file under /tmp/ with a fixed name. Allowed: relative paths, system paths
// that are the same everywhere (/etc/..., /proc/..., /usr/bin/time), and /tmp/ names that are mktemp patterns
// (`/tmp/qatserve-cluster.*`, `/tmp/x.XXXXXX`), which name no particular run.
std::vector<std::string> machine_local_paths(const std::string& text) {
  static const std::regex fixed_root(
      R"((?:^|[^A-Za-z0-9._~/-])((?:/work|/home|/root|/Users|/mnt|/scratch|/dev/shm)/[^\s`'")\]]*))");
  static const std::regex tmp_path(R"((?:^|[^A-Za-z0-9._~/-])(/tmp/[^\s`'")\]]+))");
  std::vector<std::string> out;
  for (const std::string& p : all_matches(text, fixed_root)) out.push_back(p);
  for (const std::string& p : all_matches(text, tmp_path))
    if (p.find('*') == std::string::npos && p.find("XXX") == std::string::npos) out.push_back(p);
  return out;
}

TEST(Docs, MachineLocalPathRuleSeesWhatItShould) {
  EXPECT_EQ(machine_local_paths("qatserve bench --model /work/bench/e2b-w4").size(), 1u);
  EXPECT_EQ(machine_local_paths("(`/tmp/kvint8-e2b-w4`)").size(), 1u);
  EXPECT_EQ(machine_local_paths("/home/me/models and /root/x").size(), 2u);
  EXPECT_TRUE(machine_local_paths("default a new `/tmp/qatserve-cluster.*`").empty());
  EXPECT_TRUE(machine_local_paths("tests/server/x.py, ../shared/tokenizer/, /etc/qatserve/api-key").empty());
  EXPECT_TRUE(machine_local_paths("https://github.com/a/work/b and src/work/x").empty());
}

// README.md, BENCHMARKS.md and every docs/*.md.
std::vector<fs::path> documents() {
  std::vector<fs::path> files = {kSource / "README.md", kSource / "BENCHMARKS.md"};
  for (const auto& e : fs::recursive_directory_iterator(kSource / "docs"))
    if (e.path().extension() == ".md") files.push_back(e.path());
  return files;
}

TEST(Docs, NoMachineLocalPaths) {
  for (const fs::path& f : documents()) {
    const std::vector<std::string> lines = lines_of(read_text(f));
    for (size_t i = 0; i < lines.size(); ++i)
      for (const std::string& p : machine_local_paths(lines[i]))
        ADD_FAILURE() << fs::relative(f, kSource).string() << ":" << i + 1 << ": machine-local path " << p
                      << " (write a relative path or a placeholder such as DIR)";
  }
}

// ---- links ----

// The anchor GitHub gives a heading: lower case, spaces to '-', every other character but letters, digits, '_' and
// '-' dropped (backticks, punctuation, an em dash's bytes).
std::string heading_anchor(const std::string& heading) {
  std::string out;
  for (const char c : heading) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '_' || c == '-') out += static_cast<char>(std::tolower(u));
    else if (c == ' ') out += '-';
  }
  return out;
}

std::set<std::string> anchors_of(const fs::path& file) {
  std::set<std::string> out;
  bool in_fence = false;
  for (const std::string& line : lines_of(read_text(file))) {
    if (line.starts_with("```")) in_fence = !in_fence;
    if (in_fence || !line.starts_with("#")) continue;
    const size_t text = line.find_first_not_of('#');
    if (text != std::string::npos && line[text] == ' ') out.insert(heading_anchor(line.substr(text + 1)));
  }
  return out;
}

TEST(Docs, RelativeLinksReachTheirTargets) {
  const std::regex link(R"(\]\(([^)#\s]*)(#[^)\s]*)?\))");
  for (const fs::path& f : documents()) {
    const std::string text = read_text(f);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), link); it != std::sregex_iterator(); ++it) {
      const std::string target = (*it)[1].str(), anchor = (*it)[2].str();
      if (target.find("://") != std::string::npos) continue;
      const fs::path to = target.empty() ? f : f.parent_path() / target;
      const std::string where = fs::relative(f, kSource).string() + ": link " + (*it)[0].str();
      if (!fs::exists(to)) {
        ADD_FAILURE() << where << ": no such file";
      } else if (!anchor.empty() && to.extension() == ".md" && !anchors_of(to).count(anchor.substr(1))) {
        ADD_FAILURE() << where << ": no heading with that anchor in " << fs::relative(to, kSource).string();
      }
    }
  }
}

}  // namespace
}  // namespace qs
