#include "plugins/launch/node_link_lines.h"

#include <charconv>
#include <vector>

#include "base/types.h"

namespace commsched::node_link {
namespace {

std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> out;
  size_t at = 0;
  while (at < line.size()) {
    const size_t start = line.find_first_not_of(' ', at);
    if (start == std::string_view::npos) break;
    const size_t end = std::min(line.find(' ', start), line.size());
    out.push_back(line.substr(start, end - start));
    at = end;
  }
  return out;
}

// A whole decimal number in [min, max], or nullopt.
std::optional<int> number(std::string_view w, int min, int max) {
  int n = -1;
  const auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), n);
  if (ec != std::errc() || end != w.data() + w.size() || n < min || n > max) return std::nullopt;
  return n;
}

// "w:s" with the counts HELLO accepts.
std::optional<Share> parse_share(std::string_view w) {
  const auto colon = w.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const auto workers = number(w.substr(0, colon), 1, kMaxShare);
  const auto servers = number(w.substr(colon + 1), 0, kMaxShare);
  if (!workers || !servers) return std::nullopt;
  return Share{*workers, *servers};
}

}  // namespace

bool take_line(std::string& inbox, std::string& line) {
  const auto nl = inbox.find('\n');
  if (nl == std::string::npos) return false;
  line = inbox.substr(0, nl);
  inbox.erase(0, nl + 1);
  return true;
}

bool overlong(const std::string& inbox) {
  return inbox.size() > kMaxLineBytes && inbox.find('\n') == std::string::npos;
}

std::string hello_line(const Hello& hello) {
  return "HELLO " + std::to_string(hello.node) + " " + std::to_string(hello.share.workers) + " " +
         std::to_string(hello.share.servers);
}

std::optional<Hello> parse_hello(std::string_view line) {
  const auto w = words(line);
  if (w.size() != 4 || w[0] != "HELLO") return std::nullopt;
  const auto node = number(w[1], 0, kMaxNode);
  const auto workers = number(w[2], 1, kMaxShare);
  const auto servers = number(w[3], 0, kMaxShare);
  if (!node || !workers || !servers) return std::nullopt;
  return Hello{*node, {*workers, *servers}};
}

std::string encode_shares(const std::vector<Share>& shares) {
  std::string out;
  for (const Share& s : shares)
    out += (out.empty() ? "" : ",") + std::to_string(s.workers) + ":" + std::to_string(s.servers);
  return out;
}

std::optional<std::vector<Share>> decode_shares(std::string_view word) {
  std::vector<Share> out;
  while (!word.empty() && out.size() <= static_cast<size_t>(kMaxNode)) {
    const size_t comma = std::min(word.find(','), word.size());
    const auto share = parse_share(word.substr(0, comma));
    if (!share) return std::nullopt;
    out.push_back(*share);
    if (comma == word.size()) return out;
    word.remove_prefix(comma + 1);
  }
  return std::nullopt;  // empty, a trailing comma, or more nodes than a HELLO may name
}

std::string encode_env(const std::map<std::string, std::string>& env) {
  std::string out;
  for (const auto& [k, v] : env) {
    if (k.find_first_of("=\t\n") != std::string::npos || v.find_first_of("\t\n") != std::string::npos)
      throw InvalidArgument("launch: environment entry '" + k + "' cannot be sent to the other nodes (tab/newline)");
    out += (out.empty() ? "" : "\t") + k + "=" + v;
  }
  if (out.size() + 4 > kMaxLineBytes)  // "GO " and the newline: the nodes would refuse the line
    throw InvalidArgument("launch: the environment for the other nodes is " + std::to_string(out.size()) +
                          " bytes, more than the node link's " + std::to_string(kMaxLineBytes) + "-byte line");
  return out;
}

void decode_env(std::string_view text, std::map<std::string, std::string>& env) {
  while (!text.empty()) {
    const size_t tab = std::min(text.find('\t'), text.size());
    const std::string_view kv = text.substr(0, tab);
    if (const auto eq = kv.find('='); eq != std::string_view::npos)
      env[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
    text.remove_prefix(std::min(tab + 1, text.size()));
  }
}

std::string abort_message(std::string_view line) {
  const std::string_view rest = line.size() > 6 ? line.substr(6) : std::string_view();
  const auto sp = rest.find(' ');
  return "node " + std::string(rest.substr(0, sp)) + ": " +
         (sp == std::string_view::npos ? std::string("aborted") : std::string(rest.substr(sp + 1)));
}

}  // namespace commsched::node_link
