// server/prepare_queue.h: jobs run off the calling thread, in order per worker, the bound refuses a flood at once,
// and destruction runs what was accepted before joining.

#include "server/prepare_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace qs {
namespace {

TEST(PrepareQueue, RunsJobsOnItsWorkersAndRefusesPastTheBound) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> ran{0};
  std::atomic<bool> off_thread{true};
  const std::thread::id caller = std::this_thread::get_id();
  {
    PrepareQueue queue(1, 2);
    auto blocked = [&] {
      if (std::this_thread::get_id() == caller) off_thread = false;
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return release; });
      ++ran;
    };
    EXPECT_TRUE(queue.post(blocked));   // running (or about to)
    EXPECT_TRUE(queue.post(blocked));   // waiting
    EXPECT_FALSE(queue.post(blocked));  // two pending already: refused, never run
    {
      std::lock_guard lock(mu);
      release = true;
    }
    cv.notify_all();
  }  // joins after running both accepted jobs
  EXPECT_EQ(ran.load(), 2);
  EXPECT_TRUE(off_thread.load());
}

TEST(PrepareQueue, DestructionRunsEveryAcceptedJob) {
  std::atomic<int> ran{0};
  {
    PrepareQueue queue(2, 100);
    for (int i = 0; i < 50; ++i) ASSERT_TRUE(queue.post([&] { ++ran; }));
  }
  EXPECT_EQ(ran.load(), 50);
}

}  // namespace
}  // namespace qs
