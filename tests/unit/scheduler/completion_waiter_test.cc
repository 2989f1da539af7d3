#include "scheduler/completion_waiter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace commsched {
namespace {

using namespace std::chrono_literals;

TEST(CompletionWaiter, WaitsForEveryCallbackFromOtherThreadsAndKeepsTheFirstFailure) {
  CompletionWaiter w;
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([cb = w.callback(), i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(i));
      cb(i == 5 ? Status::Error("batch 5 failed") : Status::Ok());
    });
  const Status st = w.wait(10s);
  for (auto& t : threads) t.join();
  EXPECT_EQ(st.message, "batch 5 failed");
  EXPECT_EQ(w.failures().size(), 1u);
  EXPECT_EQ(w.outstanding(), 0u);
}

TEST(CompletionWaiter, InlineCallbacksAndNothingExpectedReturnAtOnce) {
  CompletionWaiter w;
  EXPECT_TRUE(w.wait(0s).ok());
  w.callback()(Status::Ok());  // called before anyone waits, as a backend may call `done` inline
  EXPECT_TRUE(w.wait(0s).ok());
}

TEST(CompletionWaiter, TimesOutSayingHowManyAreOutstandingAndResetStartsAfresh) {
  CompletionWaiter w;
  auto first = w.callback();
  auto second = w.callback();
  first(Status::Ok());
  const Status st = w.wait(20ms);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message.find("1 of 2 completions outstanding"), std::string::npos) << st.message;
  second(Status::Error("late"));
  EXPECT_EQ(w.wait(0s).message, "late");
  w.reset();
  EXPECT_TRUE(w.wait(0s).ok());
  EXPECT_TRUE(w.failures().empty());
}

TEST(CompletionWaiter, WindowWaitReturnsOnceFewEnoughAreOutstanding) {
  CompletionWaiter w;
  std::vector<std::function<void(const Status&)>> cbs;
  for (int i = 0; i < 3; ++i) cbs.push_back(w.callback());
  const Status none_settled = w.wait(20ms, 2);
  EXPECT_NE(none_settled.message.find("3 of 3 completions outstanding"), std::string::npos) << none_settled.message;
  cbs[0](Status::Ok());
  EXPECT_TRUE(w.wait(0s, 2).ok());  // a window of 3 has room for one more
  std::thread late([&] {
    std::this_thread::sleep_for(5ms);
    cbs[1](Status::Error("second failed"));
  });
  EXPECT_EQ(w.wait(10s, 1).message, "second failed");  // woken by the settle that brings it down to 1
  late.join();
  EXPECT_EQ(w.outstanding(), 1u);
  cbs[2](Status::Ok());
  EXPECT_EQ(w.wait(0s).message, "second failed");
}

// The brief poll before a sleep (spin_wait.h): it sees an event another thread makes, and gives up after its budget.
TEST(SpinUntil, SeesAnotherThreadsEventAndGivesUpAfterItsBudget) {
  std::atomic<bool> flag{false};
  std::thread setter([&] { flag = true; });
  EXPECT_TRUE(spin_until([&] { return flag.load(); }, 10s));
  setter.join();
  int asked = 0;
  EXPECT_FALSE(spin_until([&] { return ++asked < 0; }, 0ns));
  EXPECT_EQ(asked, 1) << "a zero budget asks once";
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(spin_until([] { return false; }, 2ms));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 2ms);
}

// One spinner per process: while one thread spins, another's spin_until_alone asks once and gives up at once; once
// the first is done, the next may spin again.
TEST(SpinUntilAlone, ASecondSpinnerAsksOnceAndSleepsInstead) {
  std::atomic<bool> spinning{false}, release{false};
  std::thread first([&] {
    EXPECT_TRUE(spin_until_alone([&] {
      spinning = true;
      return release.load();
    }, 60s));
  });
  while (!spinning) std::this_thread::yield();
  int asked = 0;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(spin_until_alone([&] { return ++asked < 0; }, 10s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << "did not give up at once";
  EXPECT_EQ(asked, 1);
  EXPECT_TRUE(spin_until_alone([] { return true; }, 10s)) << "an event already there is seen without spinning";
  release = true;
  first.join();
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_FALSE(spin_until_alone([] { return false; }, 2ms));
  EXPECT_GE(std::chrono::steady_clock::now() - t1, 2ms) << "the spinner's slot was given back";
}

}  // namespace
}  // namespace commsched
