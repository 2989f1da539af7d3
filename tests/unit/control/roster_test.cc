// The one admission rule of the control plane: each awaited rank once, in range, of an awaited role.
#include <gtest/gtest.h>

#include "comm_backends/control/roster.h"

using commsched::control::PeerRole;
using commsched::control::Roster;
using commsched::control::names;

TEST(Roster, AdmitsEachAwaitedRankOnceAndSaysWhyNot) {
  Roster r;
  r.expect(PeerRole::worker, 0, 2);
  r.expect(PeerRole::server, 1, 1);
  EXPECT_FALSE(r.complete());
  EXPECT_EQ(names(r.missing()), "worker 0, worker 1, server 1");
  EXPECT_EQ(r.admit(10, {PeerRole::worker, 1}), std::nullopt);
  // The same rank on another connection: refused, the first keeps it.
  const auto dup = r.admit(11, {PeerRole::worker, 1});
  ASSERT_TRUE(dup);
  EXPECT_NE(dup->find("already connected"), std::string::npos) << *dup;
  EXPECT_EQ(r.id_of({PeerRole::worker, 1}), 10u);
  // Out of range, a role nobody waits for, and a second hello on an admitted connection.
  const auto range = r.admit(12, {PeerRole::worker, 2});
  ASSERT_TRUE(range);
  EXPECT_NE(range->find("rank 2 is out of range [0, 2)"), std::string::npos) << *range;
  const auto server0 = r.admit(13, {PeerRole::server, 0});
  ASSERT_TRUE(server0);
  EXPECT_NE(server0->find("out of range [1, 2)"), std::string::npos) << *server0;
  const auto tool = r.admit(14, {PeerRole::tool, 0});
  ASSERT_TRUE(tool);
  EXPECT_NE(tool->find("no tool is expected"), std::string::npos) << *tool;
  EXPECT_TRUE(r.admit(10, {PeerRole::worker, 0}));
  EXPECT_EQ(r.find(11), nullptr);  // refused connections are no members
  EXPECT_EQ(names(r.missing()), "worker 0, server 1");
  EXPECT_EQ(r.admit(20, {PeerRole::worker, 0}), std::nullopt);
  EXPECT_EQ(r.admit(21, {PeerRole::server, 1}), std::nullopt);
  EXPECT_TRUE(r.complete());
  EXPECT_TRUE(r.missing().empty());
  EXPECT_EQ(r.ids(PeerRole::worker), (std::vector<Roster::Id>{20, 10}));  // rank order
}

TEST(Roster, DialedMembersAreKnownButNotAwaited) {
  Roster r;
  r.add(5, {PeerRole::server, 0});
  EXPECT_TRUE(r.complete());
  ASSERT_NE(r.find(5), nullptr);
  EXPECT_EQ(r.find(5)->role, PeerRole::server);
  EXPECT_EQ(r.id_of({PeerRole::server, 0}), 5u);
  EXPECT_EQ(r.id_of({PeerRole::server, 1}), 0u);
}
