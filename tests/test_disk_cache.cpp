// Disk cache: format (golden file), hits, misses, corrupt/truncated/foreign entries,
// unwritable directories, and several processes publishing the same entry at once.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "autotune/policy.hpp"
#include "jit/disk_cache.hpp"
#include "jit/engine.hpp"
#include "jit/nvrtc.hpp"
#include "test_util.hpp"

using namespace ropejit;
using namespace ropejit::detail;
using ropejit::testing::read_file;
using ropejit::testing::temp_dir;
using ropejit::testing::write_file;

namespace {

CacheEntry sample_entry() {
  CacheEntry e;
  e.key = "rope_bshd_bf16_d128_r128_neox_pos-offset_tab-f32-half_qk_fwd_ip__v8h2t256@sm_90";
  for (int i = 0; i < 300; ++i) e.image.push_back(char(i * 7 + 3));
  return e;
}

// An entry the cache hands out: its image looks like a cubin (an ELF file).
CacheEntry loadable_entry() {
  CacheEntry e = sample_entry();
  e.image.replace(0, 4,
                  "\x7f"
                  "ELF");
  return e;
}

}  // namespace

TEST_CASE("entry format v1 is frozen by a golden file") {
  const std::string golden = std::string(ROPEJIT_GOLDEN_DIR) + "/entry_v1.rjk";
  const std::string bytes = encode_entry(sample_entry());
  if (std::getenv("ROPEJIT_UPDATE_GOLDEN")) write_file(golden, bytes);
  CHECK(read_file(golden) == bytes);
  CacheEntry back;
  std::string why;
  REQUIRE(decode_entry(read_file(golden), &back, &why));
  CHECK(back.key == sample_entry().key);
  CHECK(back.image == sample_entry().image);
  CHECK_FALSE(back.is_ptx);
}

TEST_CASE("defective entries decode as misses with a reason") {
  const std::string good = encode_entry(sample_entry());
  CacheEntry out;
  std::string why;
  CHECK_FALSE(decode_entry(good.substr(0, good.size() - 1), &out, &why));
  CHECK(why == "truncated or inconsistent header");
  CHECK_FALSE(decode_entry(good.substr(0, 20), &out, &why));
  std::string flipped = good;
  flipped[flipped.size() - 10] ^= 1;
  CHECK_FALSE(decode_entry(flipped, &out, &why));
  CHECK(why == "checksum mismatch");
  std::string version = good;
  version[8] = 9;
  CHECK_FALSE(decode_entry(version, &out, &why));
  CHECK(why == "format version 9 (this library reads 1)");
  CHECK_FALSE(
      decode_entry("\x7f"
                   "ELF not an entry at all, but long enough to have a header",
                   &out, &why));
  CHECK(why == "not a ropejit cache entry");
}

TEST_CASE("content hash covers source, options, target and NVRTC version") {
  const std::string h = content_hash("src", {"-a"}, "sm_90", 13, 0);
  CHECK(h.size() == 32);
  CHECK(h == content_hash("src", {"-a"}, "sm_90", 13, 0));
  CHECK(h != content_hash("src2", {"-a"}, "sm_90", 13, 0));
  CHECK(h != content_hash("src", {"-b"}, "sm_90", 13, 0));
  CHECK(h != content_hash("src", {"-a"}, "sm_80", 13, 0));
  CHECK(h != content_hash("src", {"-a"}, "sm_90", 13, 1));
  CHECK(content_hash("ab", {"c"}, "sm_90", 13, 0) != content_hash("a", {"bc"}, "sm_90", 13, 0));
}

TEST_CASE("store, hit, foreign, corrupt and truncated entries") {
  const std::string dir = temp_dir() + "/nested/cache";
  DiskCache cache(dir);
  REQUIRE(cache.enabled());
  struct stat st {};
  REQUIRE(stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);

  const CacheEntry e = loadable_entry();
  CacheEntry out;
  CHECK_FALSE(cache.load("00ff", e.key, &out));  // plain miss
  const std::string path = cache.store("00ff", e);
  CHECK(path == dir + "/00ff.rjk");
  CHECK(cache.count_entries() == 1);
  REQUIRE(cache.load("00ff", e.key, &out));
  CHECK(out.image == e.image);
  CHECK_FALSE(cache.load("00ff", "some other kernel", &out));  // foreign entry

  std::string bytes = read_file(path);
  write_file(path, bytes.substr(0, bytes.size() / 2));
  CHECK_FALSE(cache.load("00ff", e.key, &out));
  bytes[bytes.size() - 1] ^= 0x40;
  write_file(path, bytes);
  CHECK_FALSE(cache.load("00ff", e.key, &out));
  write_file(path, "");
  CHECK_FALSE(cache.load("00ff", e.key, &out));
}

TEST_CASE("unusable directories degrade to memory-only caching") {
  const std::string base = temp_dir();
  write_file(base + "/file", "x");
  DiskCache under_file(base + "/file/cache");
  CHECK_FALSE(under_file.enabled());
  CHECK(under_file.status().find("cannot create") != std::string::npos);
  CHECK(under_file.store("00ff", loadable_entry()).empty());

  DiskCache vanishing(base + "/gone");
  REQUIRE(vanishing.enabled());
  REQUIRE(rmdir((base + "/gone").c_str()) == 0);
  CHECK(vanishing.store("00ff", loadable_entry()).empty());  // write fails: turns itself off
  CHECK_FALSE(vanishing.enabled());

  if (geteuid() != 0) {  // root ignores permission bits
    REQUIRE(mkdir((base + "/ro").c_str(), 0500) == 0);
    DiskCache read_only(base + "/ro");
    CHECK_FALSE(read_only.enabled());
    CHECK(read_only.read_only());  // entries are read; tests/test_hostile.cpp covers the rest
  }
  DiskCache off("");
  CHECK_FALSE(off.enabled());
}

TEST_CASE("several processes publishing one entry never expose a partial file") {
  const std::string dir = temp_dir();
  CacheEntry e = loadable_entry();
  e.image.resize(size_t(1) << 20, 'z');  // large enough that a torn write would show
  constexpr int kWriters = 4;
  std::vector<pid_t> pids;
  for (int w = 0; w < kWriters; ++w) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      DiskCache c(dir);
      for (int i = 0; i < 40; ++i)
        if (c.store("abcd", e).empty()) _exit(1);
      _exit(0);
    }
    pids.push_back(pid);
  }
  DiskCache reader(dir);
  int hits = 0, torn = 0;
  for (int i = 0; i < 400; ++i) {
    const std::string bytes = read_file(dir + "/abcd.rjk");
    if (bytes.empty()) continue;  // not published yet
    CacheEntry out;
    std::string why;
    if (decode_entry(bytes, &out, &why))
      ++hits;
    else
      ++torn;
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  CHECK(torn == 0);
  CacheEntry out;
  CHECK(reader.load("abcd", e.key, &out));
  CHECK(reader.count_entries() == 1);  // temp files are gone
  MESSAGE(hits, " complete reads while writers raced");
}

TEST_CASE("engine: disk hit after a restart, recompile after corruption") {
  Spec s;
  s.head_dim = 64;
  s.style = Style::gptj;
  const Spec c = s.canonical();
  const KernelVariant v = detail::prefill_variant(c, 16);
  Engine& engine = Engine::instance();
  REQUIRE(engine.disk().enabled());
  std::string path;
  const EngineStats s0 = engine.stats();
  engine.image(c, v, "sm_90", &path);
  const EngineStats s1 = engine.stats();
  CHECK(s1.nvrtc_compiles + s1.disk_hits == s0.nvrtc_compiles + s0.disk_hits + 1);
  REQUIRE_FALSE(path.empty());

  engine.clear_memory_cache();  // as if a new process started
  const std::string image = engine.image(c, v, "sm_90").image;
  const EngineStats s2 = engine.stats();
  CHECK(s2.disk_hits == s1.disk_hits + 1);
  CHECK(s2.nvrtc_compiles == s1.nvrtc_compiles);

  std::string bytes = read_file(path);
  bytes[bytes.size() / 2] ^= 0x5a;
  write_file(path, bytes);
  engine.clear_memory_cache();
  CHECK(engine.image(c, v, "sm_90").image == image);  // recompiled: same bytes
  const EngineStats s3 = engine.stats();
  CHECK(s3.nvrtc_compiles == s2.nvrtc_compiles + 1);
  CacheEntry fixed;
  std::string why;
  CHECK(decode_entry(read_file(path), &fixed, &why));  // and the entry was rewritten
}
