// Host threads for the float64 references: `count` independent items split into contiguous
// ranges over the host's cores (at most 16, and at least 64 items each, so small problems stay
// on the calling thread). Each item's arithmetic is its own, so the results do not depend on the
// split. The decode block's references at Llama sizes took up to a minute on one core (the FFN's
// e4m3 reference at 32 tokens: 58 s on two cores before, 5.4 s after, with each weight row
// also read into doubles once instead of once per token).
#pragma once

#include <algorithm>
#include <cstdint>
#include <future>
#include <thread>
#include <vector>

namespace ropejit::oracle {

// work(begin, end) for ranges covering [0, count); waits for all, rethrows the first failure.
template <class Work>
void for_each_range(int64_t count, Work work) {
  const int64_t threads = std::min<int64_t>(
      {count / 64, 16, std::max<int64_t>(1, std::thread::hardware_concurrency())});
  if (threads <= 1) {
    if (count > 0) work(int64_t(0), count);
    return;
  }
  std::vector<std::future<void>> parts;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t begin = count * t / threads, end = count * (t + 1) / threads;
    parts.push_back(std::async(std::launch::async, [&work, begin, end] { work(begin, end); }));
  }
  for (std::future<void>& p : parts) p.get();
}

}  // namespace ropejit::oracle
