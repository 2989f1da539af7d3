// The text lines of the launchers' node link (node_link.h), read and written without sockets, so that what a
// connecting stranger may send is parsed in one place that the fuzzer (tests/fuzz/fuzz_node_link) can reach.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace commsched::node_link {

// The store key under which node 0's launcher publishes its link's port (node_link.h).
inline constexpr const char* kLinkKey = "commsched/launch/link";

// The longest line either side accepts (the GO line carries the root's environment). Longer: not a launcher of ours.
inline constexpr size_t kMaxLineBytes = 1u << 20;
// The largest node rank a HELLO may name (the root then checks it against the run's node count).
inline constexpr int kMaxNode = 1 << 20;

// Moves the first complete line (without its newline) out of `inbox` into `line`. False when there is none yet.
bool take_line(std::string& inbox, std::string& line);
// Whether `inbox` holds no complete line and more bytes than a line may have: the sender is not one of ours.
bool overlong(const std::string& inbox);

// What one node's launcher starts (its -w and -s): nodes may differ, as horovodrun's hosts of different slots do.
struct Share {
  int workers = 1;
  int servers = 0;
  bool operator==(const Share&) const = default;
};
// The largest count a HELLO may carry (the root refuses more).
inline constexpr int kMaxShare = 1 << 20;

struct Hello {
  int node = 0;
  Share share;
  bool operator==(const Hello&) const = default;
};
// HELLO <node> <workers> <servers>: a node's first line once the link is proven.
std::string hello_line(const Hello& hello);
// nullopt unless the line is exactly that, a node rank in [0, kMaxNode], workers in [1, kMaxShare] and servers in
// [0, kMaxShare].
std::optional<Hello> parse_hello(std::string_view line);

// The GO line's first word: every node's share, in node order ("w:s,w:s,..."); each node numbers its workers and
// servers after those of the nodes before it.
std::string encode_shares(const std::vector<Share>& shares);
// nullopt unless `word` is such a list (counts in the ranges parse_hello accepts).
std::optional<std::vector<Share>> decode_shares(std::string_view word);

// The GO line's environment: k=v pairs joined by tabs. Throws InvalidArgument naming an entry that cannot be sent,
// or when the line would be longer than kMaxLineBytes.
std::string encode_env(const std::map<std::string, std::string>& env);
// Adds the pairs of `text` to env (a pair without '=' is skipped).
void decode_env(std::string_view text, std::map<std::string, std::string>& env);

// "node <node>: <why>" (or "node <node>: aborted") for the line ABORT <node> [<why>].
std::string abort_message(std::string_view line);

}  // namespace commsched::node_link
