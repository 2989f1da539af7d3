// The launchers' node link (plugins/launch/node_link_lines): the bytes a connecting launcher, or a stranger, sends to
// node 0 before and after the handshake, cut into chunks the way a socket delivers them. Every line is read as node 0
// and the nodes read it: as a HELLO (with the hex of its nonce and proof), as the GO line's environment and as an
// ABORT. Nothing may crash or throw; a HELLO that parses names a node rank in range and survives being written again;
// the environment a GO line gives survives encode_env and decode_env; hex that decodes re-encodes to itself.
#include <algorithm>
#include <cctype>
#include <map>
#include <string>

#include "comm_backends/cluster_auth.h"
#include "plugins/launch/node_link_lines.h"
#include "tests/fuzz/fuzz_target.h"

using namespace commsched;

namespace {

void check_hex(const std::string& hex) {
  const auto bytes = from_hex(hex);
  if (!bytes) return;
  std::string lower = hex;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  FUZZ_CHECK(to_hex(*bytes) == lower);
}

void check_line(const std::string& line) {
  FUZZ_CHECK(line.find('\n') == std::string::npos);
  if (const auto h = node_link::parse_hello(line)) {
    FUZZ_CHECK(h->node >= 0 && h->node <= node_link::kMaxNode);
    FUZZ_CHECK(h->nonce_hex.empty() == h->proof_hex.empty());
    const std::string again = "HELLO " + std::to_string(h->node) +
                              (h->nonce_hex.empty() ? "" : " " + h->nonce_hex + " " + h->proof_hex);
    const auto h2 = node_link::parse_hello(again);
    FUZZ_CHECK(h2 && h2->node == h->node && h2->nonce_hex == h->nonce_hex && h2->proof_hex == h->proof_hex);
    check_hex(h->nonce_hex);
    check_hex(h->proof_hex);
  }
  std::map<std::string, std::string> env, again;
  node_link::decode_env(line, env);
  node_link::decode_env(node_link::encode_env(env), again);  // a decoded entry never holds a tab or a newline
  FUZZ_CHECK(again == env);
  if (line.starts_with("ABORT")) FUZZ_CHECK(node_link::abort_message(line).starts_with("node "));
  if (line.starts_with("CHALLENGE ") || line.starts_with("WELCOME ")) check_hex(line.substr(line.find(' ') + 1));
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
