// How the news of a lost peer (or of any failure that stops a group) spreads: the one rule of every control loop,
// the control plane's Van (PS server and worker) and the collective negotiator alike, whatever carries the bytes.
//
// Whoever learns of a failure first, by noticing it (a connection ended, a silent peer, a malformed message) or by
// being told, stops and passes it on once to every member it still talks to except the culprit and the one that
// told it. So the news crosses any topology (the PS's servers and workers, the negotiator's star around rank 0) in
// as many hops as it has, and every survivor fails with the same message: the culprit named first, then the first
// node that reported it ("worker 2 (127.0.0.1:4711) lost: connection closed (reported by server 0 (...))"). A report
// passed on again keeps that first reporter, so the message does not grow a suffix per hop. Later reports (the same
// loss heard from another neighbour, the neighbour's own disconnection) are dropped: a node fails once.
//
// Pure bookkeeping: no I/O, no clock. Callers send `Verdict::tell` the message in their own wire format.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace commsched::control {

class LossRelay {
 public:
  using Id = uint64_t;  // a transport's PeerId, or a rank where each rank has its own socket
  struct Verdict {
    std::string message;   // what this node fails with, and what it passes on
    std::vector<Id> tell;  // the members to pass it to, in the order given
  };

  // This node found `culprit` lost or broken; `message` names it first (see lost()). `members`: those it still talks
  // to. nullopt when this node has already failed (the first failure stands).
  std::optional<Verdict> noticed(std::string message, std::optional<Id> culprit, const std::vector<Id>& members);
  // `reporter` (named `reporter_name` in messages) told this node of a failure, in `text`.
  std::optional<Verdict> reported(const std::string& text, Id reporter, const std::string& reporter_name,
                                  const std::vector<Id>& members);

  bool stopped() const { return stopped_; }

  // "<who> lost: <why>": a lost peer named first.
  static std::string lost(const std::string& who, const std::string& why);
  // `text` with its first reporter named: " (reported by <reporter>)" appended, unless a reporter already is.
  static std::string reported_by(const std::string& text, const std::string& reporter);

 private:
  std::optional<Verdict> stop(std::string message, std::optional<Id> skip, const std::vector<Id>& members);
  bool stopped_ = false;
};

}  // namespace commsched::control
