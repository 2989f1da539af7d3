// The README's generated sections, for the tests that check them against their generators: the text between
// <!-- NAME:begin --> and <!-- NAME:end --> (COMMSCHED_SOURCE_DIR is the source tree).
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace commsched::testing {

inline std::string readme_section(const std::string& name) {
  std::ifstream in(std::string(COMMSCHED_SOURCE_DIR) + "/README.md");
  std::stringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  const std::string begin = "<!-- " + name + ":begin -->\n", end = "<!-- " + name + ":end -->";
  const size_t b = text.find(begin), e = text.find(end);
  if (b == std::string::npos || e == std::string::npos || e < b) return "README.md has no " + name + ":begin/end markers";
  return text.substr(b + begin.size(), e - b - begin.size());
}

}  // namespace commsched::testing
