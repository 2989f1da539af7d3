// The loss relay alone: who is told, the one message (culprit first, first reporter), repeats dropped; and, over the
// topologies of the PS and of the collective negotiation with any delivery order, every survivor fails once, with the
// same message, and nobody is told twice by the same node.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "comm_backends/control/loss_relay.h"

using commsched::control::LossRelay;
using Id = LossRelay::Id;

TEST(LossRelay, WhoNoticesTellsEveryMemberButTheCulprit) {
  LossRelay r;
  const auto v = r.noticed(LossRelay::lost("worker 2", "connection closed"), Id{2}, {1, 2, 3});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->message, "worker 2 lost: connection closed");
  EXPECT_EQ(v->tell, (std::vector<Id>{1, 3}));
  EXPECT_TRUE(r.stopped());
}

TEST(LossRelay, AFailureWithoutCulpritTellsEveryMember) {
  LossRelay r;
  const auto v = r.noticed("rendezvous timed out waiting for worker 1", std::nullopt, {0, 1, 2});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->tell, (std::vector<Id>{0, 1, 2}));
}

TEST(LossRelay, WhoIsToldNamesTheReporterAndTellsTheOthers) {
  LossRelay r;
  const auto v = r.reported("worker 2 lost: connection closed", 7, "server 0", {5, 7, 9});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->message, "worker 2 lost: connection closed (reported by server 0)");
  EXPECT_EQ(v->tell, (std::vector<Id>{5, 9}));
}

// A report passed on again keeps its first reporter: every survivor reads the same message.
TEST(LossRelay, ARelayedReportKeepsItsFirstReporter) {
  LossRelay r;
  const auto v = r.reported("worker 2 lost: connection closed (reported by server 0)", 4, "server 1", {4, 6});
  ASSERT_TRUE(v);
  EXPECT_EQ(v->message, "worker 2 lost: connection closed (reported by server 0)");
  EXPECT_EQ(v->tell, std::vector<Id>{6});
}

// A node fails once: the same loss heard again, another loss, or the reporter's own disconnection are dropped.
TEST(LossRelay, RepeatsAreDropped) {
  LossRelay r;
  ASSERT_TRUE(r.reported("rank 2 lost: closed", 0, "rank 0", {0}));
  EXPECT_FALSE(r.reported("rank 2 lost: closed", 0, "rank 0", {0}));
  EXPECT_FALSE(r.noticed(LossRelay::lost("rank 0", "closed the connection"), Id{0}, {0}));
  EXPECT_FALSE(r.noticed("anything else", std::nullopt, {0}));
  EXPECT_TRUE(r.stopped());
}

// --- The relay over whole topologies -------------------------------------------------------------------------------

namespace {

struct Topology {
  std::string name;
  std::map<Id, std::vector<Id>> links;  // node -> the members it talks to (symmetric)
  std::map<Id, std::string> names;
  Id culprit;
  std::vector<Id> noticers;  // the culprit's neighbours that notice it themselves (the others may hear first)
};

// The PS: server 0 (the root) talks to every node; server s >= 1 to the root and every worker; a worker to every
// server. Workers never talk to each other.
Topology parameter_server(int servers, int workers, Id culprit, std::vector<Id> noticers) {
  Topology t{"ps_" + std::to_string(servers) + "s" + std::to_string(workers) + "w", {}, {}, culprit, std::move(noticers)};
  auto link = [&](Id a, Id b) {
    t.links[a].push_back(b);
    t.links[b].push_back(a);
  };
  for (int s = 0; s < servers; ++s) t.names[static_cast<Id>(s)] = "server " + std::to_string(s);
  for (int w = 0; w < workers; ++w) t.names[static_cast<Id>(100 + w)] = "worker " + std::to_string(w);
  for (int s = 1; s < servers; ++s) link(0, static_cast<Id>(s));
  for (int s = 0; s < servers; ++s)
    for (int w = 0; w < workers; ++w) link(static_cast<Id>(s), static_cast<Id>(100 + w));
  t.name += "_lost" + std::to_string(culprit);
  return t;
}

// The negotiation: a star around rank 0.
Topology negotiator_star(int ranks, Id culprit) {
  Topology t{"star" + std::to_string(ranks) + "_lost" + std::to_string(culprit), {}, {}, culprit, {}};
  for (int r = 0; r < ranks; ++r) t.names[static_cast<Id>(r)] = "rank " + std::to_string(r);
  for (int r = 1; r < ranks; ++r) {
    t.links[0].push_back(static_cast<Id>(r));
    t.links[static_cast<Id>(r)].push_back(0);
  }
  // Rank 0 lost: every rank notices (its one connection ended). A rank lost: only rank 0 talks to it.
  if (culprit == 0)
    for (int r = 1; r < ranks; ++r) t.noticers.push_back(static_cast<Id>(r));
  else
    t.noticers.push_back(0);
  return t;
}

struct Case {
  Topology topo;
  unsigned seed;  // delivery order: 0 first in first out, otherwise shuffled with this seed
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return info.param.topo.name + "_order" + std::to_string(info.param.seed);
}

class RelayOverTopology : public testing::TestWithParam<Case> {};

}  // namespace

TEST_P(RelayOverTopology, EverySurvivorFailsOnceWithTheSameMessageNamingTheCulpritFirst) {
  const Case& c = GetParam();
  const Topology& t = c.topo;
  std::map<Id, LossRelay> relay;
  std::map<Id, std::string> failed_with;
  std::map<Id, std::set<Id>> told_by;  // receiver -> senders
  struct Msg {
    Id from, to;
    std::string text;
  };
  std::deque<Msg> wire;
  std::mt19937 rng(c.seed);
  // Every node passes its real neighbours: one that has not seen the culprit go yet still lists it.
  auto members_of = [&](Id n) { return t.links.at(n); };
  auto send_all = [&](Id from, const LossRelay::Verdict& v, bool noticed) {
    failed_with[from] = v.message;
    for (Id to : v.tell) {
      if (noticed) {
        EXPECT_NE(to, t.culprit) << t.names.at(from) << " told the node it found lost";
      }
      if (to != t.culprit) wire.push_back({from, to, v.message});  // the lost node reads nothing
    }
  };
  // Some neighbours notice at once; the first to notice may be any of them.
  std::vector<Id> noticers = t.noticers;
  if (c.seed) std::shuffle(noticers.begin(), noticers.end(), rng);
  for (Id n : noticers)
    if (auto v = relay[n].noticed(LossRelay::lost(t.names.at(t.culprit), "connection closed"), t.culprit,
                                  members_of(n)))
      send_all(n, *v, true);
  while (!wire.empty()) {
    size_t at = 0;
    if (c.seed) at = std::uniform_int_distribution<size_t>(0, wire.size() - 1)(rng);
    const Msg m = wire[at];
    wire.erase(wire.begin() + static_cast<std::ptrdiff_t>(at));
    EXPECT_TRUE(told_by[m.to].insert(m.from).second) << t.names.at(m.from) << " told " << t.names.at(m.to) << " twice";
    if (auto v = relay[m.to].reported(m.text, m.from, t.names.at(m.from), members_of(m.to))) send_all(m.to, *v, false);
  }
  const std::string culprit = t.names.at(t.culprit);
  for (const auto& [id, name] : t.names) {
    if (id == t.culprit) {
      EXPECT_FALSE(failed_with.count(id));
      continue;
    }
    ASSERT_TRUE(failed_with.count(id)) << name << " never learned of the loss";
    const std::string& msg = failed_with[id];
    EXPECT_EQ(msg.rfind(culprit + " lost: connection closed", 0), 0u) << name << ": " << msg;
    const size_t by = msg.find(" (reported by ");
    EXPECT_EQ(by, msg.rfind(" (reported by ")) << name << ": one reporter at most: " << msg;
    // Those who noticed it name no reporter; the others name a node that noticed it (the first reporter).
    const bool noticed = std::find(t.noticers.begin(), t.noticers.end(), id) != t.noticers.end();
    if (noticed && msg.find(" (reported by ") == std::string::npos) continue;
    ASSERT_NE(by, std::string::npos) << name << ": " << msg;
    bool names_a_noticer = false;
    for (Id n : t.noticers) names_a_noticer |= msg.substr(by) == " (reported by " + t.names.at(n) + ")";
    EXPECT_TRUE(names_a_noticer) << name << ": " << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Topologies, RelayOverTopology,
    testing::ValuesIn([] {
      std::vector<Case> cases;
      // A worker lost: every server notices it. Server 1 lost: the root and every worker notice. The root lost:
      // every node notices. Only some noticers in time: the others hear it first.
      const std::vector<Topology> topos{
          parameter_server(2, 3, 101, {0, 1}), parameter_server(3, 4, 100, {2}), parameter_server(2, 3, 1, {0, 100}),
          parameter_server(3, 2, 0, {1, 2, 100, 101}), negotiator_star(4, 2), negotiator_star(4, 0),
          negotiator_star(2, 1)};
      for (const auto& t : topos)
        for (unsigned seed : {0u, 1u, 2u, 3u}) cases.push_back({t, seed});
      return cases;
    }()),
    case_name);
