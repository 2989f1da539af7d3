#include "comm_backends/control/roster.h"

#include <algorithm>

namespace commsched::control {

void Roster::expect(PeerRole role, uint32_t first, uint32_t count) {
  for (uint32_t r = first; r < first + count; ++r) awaited_.emplace(std::pair{role, r}, 0);
}

namespace {
std::string role_word(PeerRole role) {
  const std::string n = ps::peer_name(role, 0);  // "worker 0"
  return n.substr(0, n.find(' '));
}
}  // namespace

std::optional<std::string> Roster::admit(Id id, Member m) {
  if (members_.count(id)) return "this connection already said hello";
  auto it = awaited_.find({m.role, m.rank});
  if (it == awaited_.end()) {
    uint32_t lo = UINT32_MAX, hi = 0;
    for (const auto& [key, conn] : awaited_)
      if (key.first == m.role) lo = std::min(lo, key.second), hi = std::max(hi, key.second + 1);
    if (lo == UINT32_MAX) return "no " + role_word(m.role) + " is expected here";
    return "rank " + std::to_string(m.rank) + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + ")";
  }
  if (it->second != 0) return "this " + role_word(m.role) + " rank is already connected";
  it->second = id;
  insert(id, m);
  return std::nullopt;
}

void Roster::add(Id id, Member m) { insert(id, m); }

void Roster::insert(Id id, Member m) {
  members_[id] = m;
  by_member_[{m.role, m.rank}] = id;
  std::vector<Id>& ids = by_role_[m.role];
  ids.clear();
  for (auto it = by_member_.lower_bound({m.role, 0}); it != by_member_.end() && it->first.first == m.role; ++it)
    ids.push_back(it->second);
}

const Roster::Member* Roster::find(Id id) const {
  auto it = members_.find(id);
  return it == members_.end() ? nullptr : &it->second;
}

Roster::Id Roster::id_of(Member m) const {
  auto it = by_member_.find({m.role, m.rank});
  return it == by_member_.end() ? 0 : it->second;
}

bool Roster::complete() const {
  for (const auto& [key, conn] : awaited_)
    if (conn == 0) return false;
  return true;
}

std::vector<Roster::Member> Roster::missing() const {
  std::vector<Member> out;
  for (const auto& [key, conn] : awaited_)
    if (conn == 0) out.push_back({key.first, key.second});
  return out;
}

std::string names(const std::vector<Roster::Member>& members) {
  std::string out;
  for (const Roster::Member& m : members) out += (out.empty() ? "" : ", ") + ps::peer_name(m.role, m.rank);
  return out;
}

const std::vector<Roster::Id>& Roster::ids(PeerRole role) const {
  static const std::vector<Id> none;
  auto it = by_role_.find(role);
  return it == by_role_.end() ? none : it->second;
}

}  // namespace commsched::control
