// The launchers' node link (plugins/launch/node_link_lines): the bytes a connecting launcher, or a stranger, sends to
// node 0 once the link is proven, cut into chunks the way a socket delivers them. Every line is read as node 0 and the
// nodes read it: as a HELLO, as the GO line's shares and environment and as an ABORT. Nothing may crash or throw; a
// HELLO that parses names a node rank in range and survives being written again, and so do the shares; the
// environment a GO line gives survives encode_env and decode_env.
#include <algorithm>
#include <map>
#include <string>

#include "plugins/launch/node_link_lines.h"
#include "tests/fuzz/fuzz_target.h"

using namespace commsched;

namespace {

void check_line(const std::string& line) {
  FUZZ_CHECK(line.find('\n') == std::string::npos);
  if (const auto hello = node_link::parse_hello(line)) {
    FUZZ_CHECK(hello->node >= 0 && hello->node <= node_link::kMaxNode);
    FUZZ_CHECK(node_link::parse_hello(node_link::hello_line(*hello)) == hello);
  }
  if (const auto shares = node_link::decode_shares(line))
    FUZZ_CHECK(node_link::decode_shares(node_link::encode_shares(*shares)) == shares);
  std::map<std::string, std::string> env, again;
  node_link::decode_env(line, env);
  node_link::decode_env(node_link::encode_env(env), again);  // a decoded entry never holds a tab or a newline
  FUZZ_CHECK(again == env);
  if (line.starts_with("ABORT")) FUZZ_CHECK(node_link::abort_message(line).starts_with("node "));
}

}  // namespace

// First byte: the chunk size (1..64); the rest is the stream.
int fuzz_node_link(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = 1 + data[0] % 64;
  std::string inbox, line;
  for (size_t at = 1; at < size; at += chunk) {
    inbox.append(reinterpret_cast<const char*>(data + at), std::min(chunk, size - at));
    while (node_link::take_line(inbox, line)) check_line(line);
    FUZZ_CHECK(!node_link::overlong(inbox) || inbox.size() > node_link::kMaxLineBytes);
  }
  return 0;
}

COMMSCHED_FUZZ_TARGET(fuzz_node_link)
