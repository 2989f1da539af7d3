// RoomWaiter: the reply queue's rule for when a payload's release wakes the server's I/O thread (only while replies
// wait for room, once per wait), and that no wake is lost when a release races the thread's last look for room.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "comm_backends/ps/reply_queue.h"

namespace commsched::ps {
namespace {

TEST(RoomWaiter, AReleaseWakesOnlyAThreadThatWaitsAndOncePerWait) {
  RoomWaiter w;
  EXPECT_FALSE(w.released()) << "nothing waits";
  EXPECT_FALSE(w.room_came([] { return false; })) << "no room: the thread sleeps until a release";
  EXPECT_TRUE(w.released());
  EXPECT_FALSE(w.released()) << "one wake per wait";
  EXPECT_TRUE(w.room_came([] { return true; })) << "room came before the second look: look again, do not sleep";
  EXPECT_FALSE(w.released()) << "the thread did not sleep: no wake";
  EXPECT_FALSE(w.room_came([] { return false; }));
  w.stop_waiting();
  EXPECT_FALSE(w.released()) << "the thread needs no room any more";
}

// The I/O thread takes the one unit of room, then looks for more and sleeps when room_came says a release will wake
// it; the releaser gives the room back and wakes it when released() says so. A lost wake leaves the thread asleep:
// the 10 s limit turns that into a failure instead of a hang (each round takes microseconds).
TEST(RoomWaiter, NoWakeIsLostWhenAReleaseRacesTheLastLook) {
  constexpr int kRounds = 20000;
  RoomWaiter w;
  std::atomic<int> room{1};
  std::mutex mu;
  std::condition_variable cv;
  int wakes = 0;
  std::atomic<bool> lost{false};
  std::thread io([&] {
    for (int i = 0; i < kRounds && !lost; ++i) {
      while (room.exchange(0) == 0) {  // out of room
        if (w.room_came([&] { return room.load() > 0; })) continue;
        std::unique_lock lock(mu);
        if (!cv.wait_for(lock, std::chrono::seconds(10), [&] { return wakes > 0; })) lost = true;
        if (lost) return;
        --wakes;
      }
      // Took the room: hand it to the releaser (a payload in the transport).
    }
  });
  std::thread releaser([&] {
    for (int i = 0; i < kRounds && !lost; ++i) {
      while (room.load() != 0 && !lost) std::this_thread::yield();  // wait until the I/O thread took it
      room.store(1);
      if (w.released()) {
        std::lock_guard lock(mu);
        ++wakes;
        cv.notify_one();
      }
    }
  });
  io.join();
  releaser.join();
  EXPECT_FALSE(lost) << "the I/O thread slept with room available and no wake coming";
}

}  // namespace
}  // namespace commsched::ps
