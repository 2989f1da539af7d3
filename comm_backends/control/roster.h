// Who belongs to a rendezvous: the members a node waits for (by role and rank), which of them have said hello and
// on which connection. The one admission rule of every control loop that gathers peers (the PS root and servers
// through the Van, the collective negotiation's coordinator on rank 0): a hello is refused, with the reason, when its
// role is not awaited here, its rank is out of range, or that rank is already connected. A refused peer takes no rank,
// so a stranger or a confused process cannot push out a real member.
//
// Pure bookkeeping (no I/O, no clock), tested without sockets. Liveness (comm_backends/liveness.h) keeps the other
// half of the state of a member: when it was last heard, whether it said goodbye.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm_backends/ps/protocol.h"

namespace commsched::control {

using ps::PeerRole;

class Roster {
 public:
  using Id = uint64_t;  // a transport's PeerId, or a rank where each rank has its own socket
  struct Member {
    PeerRole role = PeerRole::worker;
    uint32_t rank = 0;
    bool operator==(const Member&) const = default;
  };

  // This node waits for ranks [first, first + count) of `role` to say hello (several calls add up).
  void expect(PeerRole role, uint32_t first, uint32_t count);
  // A hello on connection `id` claiming `m`: admitted (nullopt), or why not ("rank 7 is out of range [0, 4)").
  std::optional<std::string> admit(Id id, Member m);
  // A member this node dialed itself (it knows who is there; no hello awaited).
  void add(Id id, Member m);
  const Member* find(Id id) const;
  // The connection of a member (0: not connected).
  Id id_of(Member m) const;
  // Every awaited member has said hello.
  bool complete() const;
  // The awaited members still missing, in role and rank order.
  std::vector<Member> missing() const;
  // The connections of every member of `role`, in rank order (kept up to date: the loops ask per message).
  const std::vector<Id>& ids(PeerRole role) const;

 private:
  void insert(Id id, Member m);
  std::map<std::pair<PeerRole, uint32_t>, Id> awaited_;  // -> 0 until its hello
  std::map<Id, Member> members_;
  std::map<std::pair<PeerRole, uint32_t>, Id> by_member_;
  std::map<PeerRole, std::vector<Id>> by_role_;  // in rank order
};

// "worker 3, server 1" ("" for none).
std::string names(const std::vector<Roster::Member>& members);

}  // namespace commsched::control
