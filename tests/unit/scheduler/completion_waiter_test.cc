#include "scheduler/completion_waiter.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace commsched
