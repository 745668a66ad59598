// Broken and hostile environments: files that are pipes, devices, directories or bombs; cache
// directories and entries another user could have planted; NVRTC options that change what is
// built; killed writers' temp files. Each must end in a clear error or a warning and a
// fallback, never a crash, a hang or a wrong kernel.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstring>
#include <sstream>
#include <string>
#include <utility>

#include "autotune/tuning_cache.hpp"
#include "jit/disk_cache.hpp"
#include "jit/files.hpp"
#include "jit/nvrtc.hpp"
#include "test_util.hpp"

using namespace ropejit;
using ropejit::testing::CommandResult;
using ropejit::testing::read_file;
using ropejit::testing::run_command;
using ropejit::testing::ScopedEnv;
using ropejit::testing::temp_dir;
using ropejit::testing::write_file;

namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

CommandResult cli(const std::string& args, const std::string& env = "") {
  return run_command(env + " " + std::string(ROPEJIT_CLI_PATH) + " " + args);
}

autotune::Fingerprint some_gpu() {
  autotune::Fingerprint f;
  f.gpu_name = "Hostile Test GPU";
  f.cc = 90;
  f.sm_count = 132;
  return f;
}

// A cache entry whose image looks like a cubin.
detail::CacheEntry loadable(const std::string& key) {
  detail::CacheEntry e;
  e.key = key;
  e.image = std::string(
                "\x7f"
                "ELF") +
            std::string(200, 'x');
  return e;
}

const char* const kKey = "rope_bshd_f16_d64_r64_neox_pos-offset_tab-f32-half_qk_fwd_ip";

}  // namespace

TEST_CASE("files that are not regular files are refused without blocking or reading them") {
  const std::string dir = temp_dir();
  REQUIRE(symlink("/dev/zero", (dir + "/zero").c_str()) == 0);
  REQUIRE(symlink("/dev/urandom", (dir + "/random").c_str()) == 0);
  REQUIRE(mkfifo((dir + "/pipe").c_str(), 0600) == 0);
  REQUIRE(mkdir((dir + "/dir").c_str(), 0700) == 0);
  write_file(dir + "/big", std::string(5000, 'x'));
  const std::pair<const char*, const char*> cases[] = {
      {"zero", "is a device"},   {"random", "is a device"},     {"pipe", "is a named pipe"},
      {"dir", "is a directory"}, {"big", "more than the 4096"},
  };
  for (const auto& [name, why] : cases) {
    const detail::FileRead r = detail::read_regular_file(dir + "/" + name, 4096);
    INFO(name, ": ", r.why);
    CHECK(r.status == detail::ReadStatus::refused);
    CHECK(contains(r.why, why));
    CHECK(r.bytes.empty());
  }
  CHECK(detail::read_regular_file(dir + "/none", 4096).status == detail::ReadStatus::missing);
  write_file(dir + "/ok", "hello");
  const detail::FileRead ok = detail::read_regular_file(dir + "/ok", 5);
  CHECK(ok.status == detail::ReadStatus::ok);
  CHECK(ok.bytes == "hello");
  CHECK(ok.owner == geteuid());

  // The tuning file and cache entries go through the same reader.
  for (const char* name : {"zero", "random", "pipe", "dir"}) {
    const autotune::TuningCache c = autotune::TuningCache::load(dir + "/" + name, some_gpu());
    CHECK(c.entries().empty());
    REQUIRE(c.warnings().size() == 1);
    CHECK(contains(c.warnings()[0], "ignoring tuning file"));
  }
  detail::DiskCache cache(temp_dir());
  REQUIRE(cache.enabled());
  const std::string hash = "feed";
  detail::CacheEntry out;
  for (const char* target : {"/dev/zero", "/dev/urandom"}) {
    ::unlink(cache.path_for(hash).c_str());
    REQUIRE(symlink(target, cache.path_for(hash).c_str()) == 0);
    CHECK_FALSE(cache.load(hash, "k", &out));
  }
  ::unlink(cache.path_for(hash).c_str());
  REQUIRE(mkfifo(cache.path_for(hash).c_str(), 0600) == 0);
  CHECK_FALSE(cache.load(hash, "k", &out));  // returns at once: a reader would block forever
}

TEST_CASE("a tuning file nested 100,000 levels deep is refused before parsing") {
  const std::string path = temp_dir() + "/deep.json";
  write_file(path, std::string(100000, '[') + std::string(100000, ']'));
  const autotune::TuningCache c = autotune::TuningCache::load(path, some_gpu());
  CHECK(c.entries().empty());
  REQUIRE(c.warnings().size() == 1);
  CHECK(contains(c.warnings()[0], "JSON nested 100000 levels deep"));
  // Brackets inside strings are text, not nesting.
  write_file(path,
             R"({"schema": 1, "fingerprint": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "entries": []})");
  const autotune::TuningCache s = autotune::TuningCache::load(path, some_gpu());
  REQUIRE(s.warnings().size() == 1);
  CHECK(contains(s.warnings()[0], "field 'fingerprint.gpu'") == false);
  CHECK(contains(s.warnings()[0], "nested") == false);
  const CommandResult r =
      cli("compile --from-tuning " + path.substr(0, path.size() - 10) + "/deep.json");
  CHECK(r.status == 2);
  write_file(path, std::string(100000, '[') + std::string(100000, ']'));
  const CommandResult deep = cli("compile --from-tuning " + path);
  INFO(deep.output);
  CHECK(deep.status == 2);
  CHECK(contains(deep.output, "JSON nested 100000 levels deep"));
}

TEST_CASE("an untrusted cache directory is refused: memory-only caching with one warning") {
  const std::string base = temp_dir();
  const std::string open_dir = base + "/world-writable";
  REQUIRE(mkdir(open_dir.c_str(), 0700) == 0);
  REQUIRE(chmod(open_dir.c_str(), 0777) == 0);
  detail::DiskCache world(open_dir);
  CHECK_FALSE(world.enabled());
  CHECK(contains(world.status(), "writable by others"));
  CHECK(world.store("abcd", loadable("k")).empty());
  // An entry planted there is not read either.
  REQUIRE(chmod(open_dir.c_str(), 0700) == 0);
  detail::DiskCache writer(open_dir);
  REQUIRE(writer.enabled());
  REQUIRE_FALSE(writer.store("abcd", loadable("k")).empty());
  REQUIRE(chmod(open_dir.c_str(), 0770) == 0);
  detail::DiskCache group(open_dir);
  CHECK(contains(group.status(), "writable by its group"));
  detail::CacheEntry out;
  CHECK_FALSE(group.load("abcd", "k", &out));

  // The command says so too.
  const CommandResult info = cli("info", "ROPEJIT_CACHE_DIR=" + open_dir);
  CHECK(contains(info.output, "refusing to use it"));

  if (geteuid() == 0) {  // only root can give a directory and an entry to another user
    const std::string theirs = base + "/theirs";
    REQUIRE(mkdir(theirs.c_str(), 0700) == 0);
    REQUIRE(chown(theirs.c_str(), 65534, 65534) == 0);
    detail::DiskCache other(theirs);
    CHECK_FALSE(other.enabled());
    CHECK(contains(other.status(), "owned by uid 65534"));

    const std::string mine = base + "/mine";
    detail::DiskCache cache(mine);
    REQUIRE(cache.enabled());
    const std::string path = cache.store("beef", loadable("k"));
    REQUIRE_FALSE(path.empty());
    REQUIRE(cache.load("beef", "k", &out));
    REQUIRE(chown(path.c_str(), 65534, 65534) == 0);
    CHECK_FALSE(cache.load("beef", "k", &out));  // planted by another user: a miss
    REQUIRE(chown(path.c_str(), geteuid(), getegid()) == 0);
    REQUIRE(chmod(path.c_str(), 0666) == 0);
    CHECK_FALSE(cache.load("beef", "k", &out));  // writable by others: a miss
    REQUIRE(chmod(path.c_str(), 0600) == 0);
    CHECK(cache.load("beef", "k", &out));
  } else {
    MESSAGE("not root: the other-owner cases need chown and are not run here");
  }
}

TEST_CASE("temp files of killed writers are removed after an hour, fresh ones kept") {
  const std::string dir = temp_dir();
  const std::string stale = dir + "/.abcd.rjk.123.456.789.tmp";
  const std::string fresh = dir + "/.abcd.rjk.123.456.790.tmp";
  const std::string other = dir + "/notes.tmp";  // not ours: no leading dot
  write_file(stale, "partial");
  write_file(fresh, "partial");
  write_file(other, "x");
  REQUIRE(run_command("touch -d '2 hours ago' '" + stale + "' '" + other + "'").status == 0);
  detail::DiskCache cache(dir);
  REQUIRE(cache.enabled());
  CHECK(access(stale.c_str(), F_OK) != 0);
  CHECK(access(fresh.c_str(), F_OK) == 0);
  CHECK(access(other.c_str(), F_OK) == 0);
}

TEST_CASE("temp files of a writer that no longer runs are removed after a minute") {
  const std::string dir = temp_dir();
  // A pid that is no process: the writer was killed. One of this process: a live writer.
  const std::string dead = dir + "/.abcd.rjk.2147483646.456.789.tmp";
  const std::string live = dir + "/.abcd.rjk." + std::to_string(getpid()) + ".456.789.tmp";
  const std::string young = dir + "/.abcd.rjk.2147483646.456.790.tmp";
  for (const std::string& f : {dead, live, young}) write_file(f, "partial");
  REQUIRE(run_command("touch -d '2 minutes ago' '" + dead + "' '" + live + "'").status == 0);
  detail::DiskCache cache(dir);
  REQUIRE(cache.enabled());
  CHECK(access(dead.c_str(), F_OK) != 0);
  CHECK(access(live.c_str(), F_OK) == 0);
  CHECK(access(young.c_str(), F_OK) == 0);  // within the grace: maybe a writer elsewhere
}

TEST_CASE("saving a tuning file removes its own stale temp files, and nobody else's") {
  const std::string dir = temp_dir();
  const std::string path = dir + "/mine.json";
  const std::string ours = dir + "/.mine.json.1.2.3.tmp";
  const std::string theirs = dir + "/.notes.tmp";
  write_file(ours, "partial");
  write_file(theirs, "the user's");
  REQUIRE(run_command("touch -d '2 hours ago' '" + ours + "' '" + theirs + "'").status == 0);
  autotune::TuningCache c;
  c.set_fingerprint(some_gpu());
  c.save(path);
  CHECK(access(ours.c_str(), F_OK) != 0);
  CHECK(access(theirs.c_str(), F_OK) == 0);
  CHECK(access(path.c_str(), F_OK) == 0);
}

TEST_CASE("empty or unloadable images are never stored, and are misses when found") {
  detail::DiskCache cache(temp_dir());
  REQUIRE(cache.enabled());
  detail::CacheEntry empty;
  empty.key = "k";
  CHECK(cache.store("0001", empty).empty());
  detail::CacheEntry not_elf = loadable("k");
  not_elf.image[0] = 'X';
  CHECK(cache.store("0002", not_elf).empty());
  CHECK(cache.count_entries() == 0);
  // Planted on disk (as an older ropejit with -dlto once did): a miss.
  write_file(cache.path_for("0001"), detail::encode_entry(empty));
  REQUIRE(chmod(cache.path_for("0001").c_str(), 0600) == 0);
  detail::CacheEntry out;
  CHECK_FALSE(cache.load("0001", "k", &out));
  CHECK(detail::image_problem("", false) == "empty image");
  CHECK(detail::image_problem("abc", true) == "not NUL-terminated PTX text");
  CHECK(detail::image_problem(std::string(".version 8.0\n") + '\0', true).empty());
}

TEST_CASE("NVRTC options that change what is built are refused, and nothing is cached") {
  const std::string dir = temp_dir();
  const std::pair<const char*, const char*> cases[] = {
      {"--dlink-time-opt", "asks for link-time IR"},
      {"-dlto", "asks for link-time IR"},
      {"-arch=sm_80", "sets the target architecture"},
      {"--gpu-architecture=compute_80", "sets the target architecture"},
      {"-rdc=true", "asks for relocatable code"},
  };
  for (const auto& [flag, why] : cases) {
    const CommandResult r =
        cli(std::string("compile --arch sm_90 --key ") + kKey,
            "ROPEJIT_CACHE_DIR=" + dir + " ROPEJIT_NVRTC_FLAGS='-lineinfo " + flag + "'");
    INFO(r.output);
    CHECK(r.status == 2);
    CHECK(contains(r.output, std::string("ROPEJIT_NVRTC_FLAGS: '") + flag + "' " + why));
    CHECK_FALSE(contains(r.output, "FAILED"));  // refused once, before any compile
  }
  CHECK(run_command("ls '" + dir + "' | grep -c rjk").output == "0\n");
  ScopedEnv flags("ROPEJIT_NVRTC_FLAGS", "--gpu-architecture sm_80");
  CHECK_THROWS_WITH_AS(detail::compile_options("sm_90"),
                       doctest::Contains("'--gpu-architecture' sets the target architecture"),
                       Error);
}

TEST_CASE(
    "a cache entry that is a symbolic link is a miss and is replaced, never written through") {
  const std::string dir = temp_dir();
  const std::string cache = dir + "/cache";
  const std::string env = "ROPEJIT_CACHE_DIR=" + cache;
  const CommandResult first = cli(std::string("compile --arch sm_90 --key ") + kKey, env);
  INFO(first.output);
  REQUIRE(first.status == 0);
  std::istringstream listing(run_command("ls '" + cache + "' | grep 'rjk$'").output);
  std::string one, two;
  REQUIRE(std::getline(listing, one));
  REQUIRE(std::getline(listing, two));
  one = cache + "/" + one;
  two = cache + "/" + two;
  // One entry points at a file of the user's, the other at a device node (root can make one:
  // /dev/null's numbers), or at a second file.
  const std::string mine = dir + "/precious.txt";
  write_file(mine, "keep me");
  const std::string node = dir + "/node";
  const bool have_node = geteuid() == 0 && mknod(node.c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0;
  const std::string second = have_node ? node : dir + "/second.txt";
  if (!have_node) write_file(second, "keep me too");
  for (const auto& [entry, target] : {std::pair{one, mine}, std::pair{two, second}}) {
    REQUIRE(unlink(entry.c_str()) == 0);
    REQUIRE(symlink(target.c_str(), entry.c_str()) == 0);
  }
  const CommandResult again = cli(std::string("compile --arch sm_90 --key ") + kKey, env);
  INFO(again.output);
  CHECK(again.status == 0);
  CHECK(contains(again.output, "is a symbolic link"));
  CHECK(read_file(mine) == "keep me");
  struct stat st {};
  if (have_node) {
    REQUIRE(lstat(node.c_str(), &st) == 0);
    CHECK(S_ISCHR(st.st_mode));
  } else {
    CHECK(read_file(second) == "keep me too");
  }
  // The links were replaced by regular entries: a third run is all disk hits.
  for (const std::string& entry : {one, two}) {
    REQUIRE(lstat(entry.c_str(), &st) == 0);
    CHECK(S_ISREG(st.st_mode));
  }
  const CommandResult third = cli(std::string("compile --arch sm_90 --key ") + kKey, env);
  INFO(third.output);
  CHECK(third.status == 0);
  CHECK_FALSE(contains(third.output, "symbolic link"));
}

TEST_CASE("saving the tuning file through a symlink keeps the link and updates its target") {
  const std::string dir = temp_dir();
  const std::string target = dir + "/shared/tuning.json";
  REQUIRE(mkdir((dir + "/shared").c_str(), 0700) == 0);
  const std::string link = dir + "/tuning.json";
  REQUIRE(symlink("shared/tuning.json", link.c_str()) == 0);  // relative, and dangling for now
  autotune::TuningCache c;
  c.set_fingerprint(some_gpu());
  autotune::TuningEntry e;
  e.key = kKey;
  e.bucket = 64;
  e.q_heads = 8;
  e.k_heads = 8;
  e.config.kernel = detail::prefill_variant(parse_key(kKey), 16);
  e.config.rows = 8;
  c.put(e);
  c.save(link);
  struct stat st {};
  REQUIRE(lstat(link.c_str(), &st) == 0);
  CHECK(S_ISLNK(st.st_mode));
  CHECK(contains(read_file(target), kKey));
  CHECK(autotune::TuningCache::load(link, some_gpu()).entries().size() == 1);
}

TEST_CASE("the command names what is wrong and exits 2") {
  const std::string tuning = temp_dir() + "/tuning.json";
  autotune::TuningCache c;
  c.set_fingerprint(some_gpu());
  autotune::TuningEntry e;
  e.key = kKey;
  e.bucket = 64;
  e.q_heads = 8;
  e.k_heads = 8;
  e.config.kernel = detail::prefill_variant(parse_key(kKey), 16);
  e.config.rows = 8;
  c.put(e);
  c.save(tuning);
  const std::pair<std::string, std::string> cases[] = {
      {"foo", "unknown command 'foo' (commands: info, compile, tune, source, demo"},
      {std::string(5000, 'x'), "unknown command 'xxxxxxxx"},
      {"compile --from-tuning /tmp", "tuning file /tmp cannot be used: is a directory"},
      {"compile --from-tuning /nonexistent.json", "tuning file /nonexistent.json does not exist"},
      {"compile --key " + std::string(kKey) + " -j 100000", "--jobs: Value 100000 not in range"},
      {"compile --from-tuning " + tuning + " --key " + kKey, "--from-tuning takes the keys"},
      {"compile --from-tuning " + tuning + " --preset phi-2", "--from-tuning takes the keys"},
      {"compile --arch sm_0090 --key " + std::string(kKey),
       "--arch ('sm_0090') must look like sm_90"},
      {"compile --arch sm_" + std::string(10000, '9') + " --key " + kKey, "(10003 characters)"},
      {"tune --heads 100000 --dry-run", "--heads (100000) must be Q or Q,K with 1 <= Q <= 65536"},
      {"tune --heads 32,70000 --dry-run", "0 <= K <= 65536"},
  };
  for (const auto& [args, message] : cases) {
    const CommandResult r = cli(args);
    INFO(args.substr(0, 80), ": ", r.output.substr(0, 400));
    CHECK(r.status == 2);
    CHECK(contains(r.output, message));
    CHECK(r.output.size() < 1000);  // long inputs are not echoed whole
  }
  // --arch with --from-tuning: honoured (kernels for sm_80 although the file is for sm_90).
  const CommandResult arch = cli("compile --from-tuning " + tuning + " --arch sm_80");
  INFO(arch.output);
  CHECK(arch.status == 0);
  CHECK(contains(arch.output, "sm_80  " + std::string(kKey)));
  CHECK_FALSE(contains(arch.output, "sm_90  "));
}

namespace {

// "N compiled" and "M from the disk cache" of a compile summary line.
std::pair<long, long> compiled_and_hits(const std::string& out) {
  const size_t at = out.find(" compiled, ");
  if (at == std::string::npos) return {-1, -1};
  const size_t start = out.rfind(' ', at - 1) + 1;
  return {std::stol(out.substr(start, at - start)),
          std::stol(out.substr(at + std::strlen(" compiled, ")))};
}

}  // namespace

TEST_CASE(
    "eight processes compiling one preset into one empty directory compile each kernel "
    "once" *
    doctest::test_suite("long")) {
  const std::string dir = temp_dir() + "/shared";
  std::string script = "for i in 1 2 3 4 5 6 7 8; do (ROPEJIT_CACHE_DIR=" + dir + " " +
                       ROPEJIT_CLI_PATH + " compile --arch sm_90 --preset phi-2 -j 1; echo " +
                       "\"exit $?\") > " + dir + ".$i 2>&1 & done; wait";
  REQUIRE(run_command(script).status == 0);
  long compiled = 0;
  for (int i = 1; i <= 8; ++i) {
    const std::string out = read_file(dir + "." + std::to_string(i));
    INFO(out);
    CHECK(contains(out, "32 keys: 64 kernels in"));
    CHECK(contains(out, "exit 0"));
    const auto [c, hits] = compiled_and_hits(out);
    CHECK(c + hits == 64);
    compiled += c;
  }
  CHECK(compiled == 64);  // every entry compiled by one process, loaded by the seven others
  const CommandResult ninth =
      cli("compile --arch sm_90 --preset phi-2 -j 1", "ROPEJIT_CACHE_DIR=" + dir);
  CHECK(contains(ninth.output, " 0 compiled, 64 from the disk cache"));
  CHECK(run_command("ls " + dir + " | grep -c '\\.lock$'").output == "0\n");  // removed
}

TEST_CASE("a read-only cache directory is read, and what it lacks is compiled into memory") {
  // Root writes through any mode: as root, the commands run as nobody, who owns the directory.
  char made[] = "/tmp/ropejit-ro-XXXXXX";
  REQUIRE(mkdtemp(made) != nullptr);
  const std::string dir = made;
  std::string as_user;
  if (geteuid() == 0) {
    if (run_command("command -v setpriv").status != 0) {
      MESSAGE("SKIPPED: running as root and setpriv is missing to run as another user");
      run_command("rm -rf " + dir);
      return;
    }
    REQUIRE(chmod(dir.c_str(), 0700) == 0);
    REQUIRE(chown(dir.c_str(), 65534, 65534) == 0);
    as_user = "setpriv --reuid=65534 --regid=65534 --clear-groups ";
  }
  const std::string run = as_user + "env HOME=" + dir + " ROPEJIT_CACHE_DIR=" + dir + " " +
                          ROPEJIT_CLI_PATH + " compile --arch sm_90 --key ";
  const std::string other = "rope_bshd_bf16_d64_r64_neox_pos-offset_tab-f32-half_qk_fwd_ip";
  CommandResult r = run_command(run + kKey);  // the image build
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, " 2 compiled, 0 from the disk cache"));
  REQUIRE(chmod(dir.c_str(), 0500) == 0);  // mounted read-only in the image
  r = run_command(run + kKey);
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, " 0 compiled, 2 from the disk cache"));
  CHECK(contains(r.output, "is read-only: its entries are read"));
  CHECK(contains(r.output, "the disk cache is read-only and held every kernel"));
  r = run_command(run + other);  // a key the image lacks: compiled, and said to be unsaved
  INFO(r.output);
  CHECK(r.status == 1);
  CHECK(contains(r.output, " 2 compiled, 0 from the disk cache"));
  CHECK(contains(r.output, "nothing was saved"));
  REQUIRE(chmod(dir.c_str(), 0700) == 0);
  run_command("rm -rf " + dir);
}

TEST_CASE("compile says when nothing could be saved") {
  for (const char* env :
       {"ROPEJIT_CACHE_DIR=off", "env -u ROPEJIT_CACHE_DIR -u HOME -u XDG_CACHE_HOME"}) {
    const CommandResult r = cli(std::string("compile --key ") + kKey, env);
    INFO(env, ": ", r.output);
    CHECK(r.status == 1);
    CHECK(contains(r.output, "nothing was saved: the disk cache is off"));
  }
}

TEST_CASE("NVRTC options that change floating-point rounding are refused, harmless values pass") {
  const char* const refused[] = {
      "--use_fast_math",
      "-use_fast_math",
      "--ftz=true",
      "-ftz=true",
      "--ftz",
      "--prec-div=false",
      "-prec-div=false",
      "--prec-sqrt=false",
      "-prec-sqrt=false",
      "--fmad=false",
      "-fmad=false",
  };
  for (const char* flag : refused) {
    ScopedEnv flags("ROPEJIT_NVRTC_FLAGS", std::string("-lineinfo ") + flag);
    const std::string message =
        std::string("ROPEJIT_NVRTC_FLAGS: '") + flag + "' changes floating-point rounding";
    CHECK_THROWS_WITH_AS(detail::compile_options("sm_90"), doctest::Contains(message.c_str()),
                         Error);
  }
  // ropejit's own values (or NVRTC's defaults) change nothing.
  for (const char* flag : {"--ftz=false", "-prec-div=true", "--prec-sqrt=true", "--fmad=true",
                           "--Ofast-compile=min"}) {
    ScopedEnv flags("ROPEJIT_NVRTC_FLAGS", flag);
    CHECK(detail::compile_options("sm_90").back() == flag);
  }
  const std::string dir = temp_dir();
  const CommandResult r = cli(std::string("compile --arch sm_90 --key ") + kKey,
                              "ROPEJIT_CACHE_DIR=" + dir + " ROPEJIT_NVRTC_FLAGS=--use_fast_math");
  INFO(r.output);
  CHECK(r.status == 2);
  CHECK(
      contains(r.output, "ROPEJIT_NVRTC_FLAGS: '--use_fast_math' changes floating-point rounding"));
  CHECK_FALSE(contains(r.output, "FAILED"));  // refused once, before any compile
  CHECK(run_command("ls '" + dir + "' | grep -c rjk").output == "0\n");
}

TEST_CASE("ropejit info shows the NVRTC options in force, and refused ones") {
  const CommandResult plain = cli("info", "env -u ROPEJIT_NVRTC_FLAGS");
  INFO(plain.output);
  CHECK(
      contains(plain.output, "compile opts --gpu-architecture=<per GPU> --std=c++17 --fmad=true"));
  CHECK(contains(plain.output, "extra opts   - (ROPEJIT_NVRTC_FLAGS unset)"));
  const CommandResult extra = cli("info", "ROPEJIT_NVRTC_FLAGS='--Ofast-compile=min -lineinfo'");
  INFO(extra.output);
  CHECK(contains(extra.output, "extra opts   --Ofast-compile=min -lineinfo (ROPEJIT_NVRTC_FLAGS)"));
  const CommandResult refused = cli("info", "ROPEJIT_NVRTC_FLAGS=-ftz=true");
  INFO(refused.output);
  CHECK(refused.status == 0);
  CHECK(contains(refused.output,
                 "extra opts   refused, every compile fails: ropejit: "
                 "ROPEJIT_NVRTC_FLAGS: '-ftz=true' changes floating-point rounding"));
}

TEST_CASE(
    "relative ROPEJIT_CACHE_DIR, XDG_CACHE_HOME and ROPEJIT_TUNING_FILE are ignored, saying so") {
  const std::string home = temp_dir();
  const std::string cwd = temp_dir();
  const std::string fallback = home + "/.cache/ropejit";
  // From a directory of its own, where nothing may appear, with only the variables given.
  auto info = [&](const std::string& vars) {
    return cli("info", "cd '" + cwd +
                           "' && env -u ROPEJIT_CACHE_DIR -u ROPEJIT_TUNING_FILE -u XDG_CACHE_HOME "
                           "HOME='" +
                           home + "' " + vars);
  };
  const CommandResult r = info("ROPEJIT_CACHE_DIR=rel/cache ROPEJIT_TUNING_FILE=tuning.json");
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "ROPEJIT_CACHE_DIR ('rel/cache') is a relative path and is ignored"));
  CHECK(contains(r.output, "using " + fallback + " instead"));
  CHECK(
      contains(r.output, "ROPEJIT_TUNING_FILE ('tuning.json') is a relative path and is ignored"));
  CHECK(contains(r.output, "using " + fallback + "/tuning.json instead"));
  CHECK(contains(r.output, "cache dir    " + fallback + " (ok)"));
  CHECK(contains(r.output, "tuning file  " + fallback + "/tuning.json"));
  CHECK(run_command("ls -A '" + cwd + "'").output.empty());

  const CommandResult xdg = info("XDG_CACHE_HOME=xdg");
  INFO(xdg.output);
  CHECK(contains(xdg.output, "XDG_CACHE_HOME ('xdg') is a relative path and is ignored"));
  CHECK(contains(xdg.output, "cache dir    " + fallback + " (ok)"));
  CHECK(run_command("ls -A '" + cwd + "'").output.empty());
  // Absolute values are used as they are, without a word.
  const CommandResult abs = info("XDG_CACHE_HOME='" + home + "/xdg'");
  INFO(abs.output);
  CHECK(contains(abs.output, "cache dir    " + home + "/xdg/ropejit (ok)"));
  CHECK(contains(abs.output, "tuning file  " + home + "/xdg/ropejit/tuning.json"));
  CHECK_FALSE(contains(abs.output, "warning"));
  // Nothing to fall back on: no disk cache, and the warning says so.
  const CommandResult none =
      cli("info", "env -u HOME -u XDG_CACHE_HOME -u ROPEJIT_TUNING_FILE ROPEJIT_CACHE_DIR=rel");
  INFO(none.output);
  CHECK(contains(none.output, "using no disk cache (compiled kernels cached in memory only)"));
  CHECK(contains(none.output, "cache dir    - "));
  CHECK(contains(none.output, "tuning file  - (off)"));

  // The library's own lookups agree.
  ScopedEnv cache("ROPEJIT_CACHE_DIR", "rel/cache");
  ScopedEnv tuning("ROPEJIT_TUNING_FILE", "tuning.json");
  ScopedEnv xdg_env("XDG_CACHE_HOME", "xdg");
  ScopedEnv home_env("HOME", home);
  CHECK(detail::DiskCache::default_dir() == fallback);
  CHECK(autotune::default_tuning_path() == fallback + "/tuning.json");
}

TEST_CASE("100 kB paths are quoted clipped, in errors, warnings and ropejit info") {
  std::string path = temp_dir();
  while (path.size() < 100000) path += "/" + std::string(200, 'd');
  const std::pair<std::string, std::string> cases[] = {
      {"info", "ROPEJIT_CACHE_DIR=" + path},
      {"info", "ROPEJIT_TUNING_FILE=" + path + "/tuning.json"},
      {std::string("compile --key ") + kKey, "ROPEJIT_CACHE_DIR=" + path},
      {"compile --from-tuning " + path + "/tuning.json", ""},
      {"compile --hf-config " + path + "/config.json", ""},
      {"source --hf-config " + path + "/config.json", ""},
  };
  for (const auto& [args, env] : cases) {
    const CommandResult r = cli(args, env);
    INFO(args.substr(0, 40), " with ", env.substr(0, 40), ": ", r.output.substr(0, 2000));
    CHECK(r.output.size() < 2000);
    CHECK(contains(r.output, " characters)"));
  }
  // In the library: the cache's status, the tuning file's warnings and errors, configs.
  CHECK(detail::DiskCache(path).status().size() < 1000);
  const autotune::TuningCache c = autotune::TuningCache::load(path, some_gpu());
  for (const std::string& w : c.warnings()) CHECK(w.size() < 1000);
  CHECK_THROWS_WITH_AS(autotune::TuningCache::load_as_tuned(path), doctest::Contains("... (100"),
                       Error);
  try {
    c.save(path + "/tuning.json");
    FAIL("saved under a 100 kB path");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).size() < 1000);
  }
  try {
    model_from_hf_config_file(path);
    FAIL("read a 100 kB path");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).size() < 1000);
  }
}
