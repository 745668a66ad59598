// Tuning cache: JSON schema 1 (golden file), strict per-entry validation, GPU fingerprints,
// merging and atomic saves, token buckets and the default path.
#include <dirent.h>
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "autotune/tuning_cache.hpp"
#include "jit/disk_cache.hpp"
#include "test_util.hpp"

using namespace ropejit;
using namespace ropejit::autotune;
using nlohmann::json;

namespace {

using ropejit::testing::read_file;
using ropejit::testing::temp_dir;
using ropejit::testing::write_file;

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  REQUIRE(d != nullptr);
  while (const dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  return names;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

using ropejit::testing::ScopedEnv;

Fingerprint h200() {
  Fingerprint f;
  f.gpu_name = "NVIDIA H200";
  f.cc = 90;
  f.sm_count = 132;
  f.driver_version = 13000;
  f.nvrtc = "13.0";
  f.library = "0.1.0";
  return f;
}

// rope_bshd_bf16_d128_r128_neox_pos-offset_tab-f32-half_qk_fwd_ip: 8 chunks of 8 elements.
std::string bf16_key() { return Spec().key(); }

// f32 gptj with a pass-through tail, out of place: 16 chunks of 4 elements.
std::string f32_key() {
  Spec s;
  s.dtype = DType::f32;
  s.head_dim = 64;
  s.rotary_dim = 32;
  s.style = Style::gptj;
  s.positions = Positions::ids;
  s.index_type = IndexType::i32;
  s.table_width = TableWidth::full;
  s.in_place = false;
  return s.key();
}

TuningEntry entry(const std::string& key, int64_t bucket, int32_t q, int32_t k, int32_t vec,
                  int32_t hpt, int32_t max_threads, int32_t rows, int32_t tpb, int32_t bps,
                  double median_us, double gbps, double default_us) {
  TuningEntry e;
  e.key = key;
  e.bucket = bucket;
  e.q_heads = q;
  e.k_heads = k;
  e.config.kernel.vec = vec;
  e.config.kernel.heads_per_thread = hpt;
  e.config.kernel.max_threads = max_threads;
  e.config.rows = rows;
  e.config.tokens_per_block = tpb;
  detail::set_persistent(e.config, bps);
  e.median_us = median_us;
  e.gbps = gbps;
  e.default_us = default_us;
  return e;
}

TuningEntry sample() { return entry(bf16_key(), 64, 32, 8, 8, 2, 256, 4, 2, 0, 2.1, 640.5, 2.5); }

// The cache frozen by tests/golden/tuning_v1.json.
TuningCache golden_cache() {
  TuningCache c;
  c.set_fingerprint(h200());
  c.put(sample());
  c.put(entry(bf16_key(), 4096, 32, 8, 8, 4, 512, 8, 4, 0, 41.25, 1633.0, 44.0));
  c.put(entry(f32_key(), 1, 8, 0, 4, 1, 128, 2, 4, 4, 1.75, 12.0625, 1.75));
  c.put(entry(f32_key(), 2147483648LL, 8, 0, 2, 8, 1024, 8, 2, 0, 90000.5, 0, 123456.75));
  return c;
}

// A schema-1 document for h200() holding `entries` as given (valid or not).
json document(const std::vector<json>& entries) {
  json doc = golden_cache().to_json();
  doc["entries"] = entries;
  return doc;
}

json sample_json() {
  TuningCache c;
  c.put(sample());
  return c.to_json().at("entries").at(0);
}

// A fused key: Qwen3's serving step with dynamic FP8 scales into a paged cache.
std::string qwen3_dynamic_fp8_key() {
  return parse_key(
             "rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-oe4m3dyn-cpaged-"
             "e4m3dyn_fwd_oop")
      .canonical()
      .key();
}

}  // namespace

TEST_CASE("tuning cache: token buckets are powers of two") {
  CHECK(detail::token_bucket(-7) == 1);
  CHECK(detail::token_bucket(0) == 1);
  CHECK(detail::token_bucket(1) == 1);
  CHECK(detail::token_bucket(2) == 2);
  CHECK(detail::token_bucket(3) == 4);
  CHECK(detail::token_bucket(64) == 64);
  CHECK(detail::token_bucket(65) == 128);
  CHECK(detail::token_bucket(4096) == 4096);
  CHECK(detail::token_bucket(4097) == 8192);
  CHECK(detail::token_bucket((int64_t(1) << 31) - 1) == int64_t(1) << 31);
  CHECK(detail::token_bucket(INT64_MAX) == int64_t(1) << 62);  // saturates instead of overflowing
}

TEST_CASE("tuning cache: put replaces the same slot and keeps entries sorted") {
  TuningCache c;
  const TuningEntry a = sample();
  TuningEntry b = a;
  b.bucket = 8;
  TuningEntry d = a;
  d.k_heads = 0;
  TuningEntry f = entry(f32_key(), 1, 8, 0, 4, 1, 128, 2, 4, 4, 1.75, 12.0625, 1.75);
  for (const TuningEntry& e : {f, a, d, b}) c.put(e);
  REQUIRE(c.entries().size() == 4);
  // bf16 key < f32 key; then by bucket, q_heads, k_heads.
  CHECK(c.entries()[0] == b);
  CHECK(c.entries()[1] == d);
  CHECK(c.entries()[2] == a);
  CHECK(c.entries()[3] == f);

  REQUIRE(c.find(a.key, 64, 32, 8) != nullptr);
  CHECK(*c.find(a.key, 64, 32, 8) == a);
  CHECK(c.find(a.key, 64, 32, 7) == nullptr);
  CHECK(c.find(a.key, 128, 32, 8) == nullptr);
  CHECK(c.find(f32_key(), 64, 32, 8) == nullptr);

  TuningEntry faster = a;
  faster.config.rows = 8;
  faster.median_us = 1.5;
  c.put(faster);
  CHECK(c.entries().size() == 4);
  CHECK(c.find(a.key, 64, 32, 8)->config.rows == 8);

  TuningEntry bad = a;
  bad.config.kernel.vec = 16;  // put() checks what load() checks
  CHECK_THROWS_WITH_AS(c.put(bad), doctest::Contains("config.vec (16) must be 1, 2, 4 or 8"),
                       Error);
  bad = a;
  bad.gbps = std::numeric_limits<double>::quiet_NaN();  // JSON cannot even spell it
  CHECK_THROWS_WITH_AS(c.put(bad), doctest::Contains("gbps (nan) must be finite"), Error);
  bad.gbps = std::numeric_limits<double>::infinity();
  CHECK_THROWS_AS(c.put(bad), Error);
  CHECK(c.entries().size() == 4);
}

TEST_CASE("tuning cache: save and load round trip") {
  ScopedEnv quiet("ROPEJIT_QUIET", "1");
  const std::string base = temp_dir();
  const std::string dir = base + "/nested/dir";
  const std::string path = dir + "/tuning.json";
  const TuningCache c = golden_cache();
  c.save(path);
  struct stat st {};
  REQUIRE(stat(dir.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  CHECK(list_dir(dir) == std::vector<std::string>{"tuning.json"});  // no temp files left

  const TuningCache back = TuningCache::load(path, h200());
  CHECK(back.warnings().empty());
  CHECK(back.fingerprint() == h200());
  CHECK(back.entries() == c.entries());
  const TuningEntry* e = back.find(bf16_key(), 64, 32, 8);
  REQUIRE(e != nullptr);
  CHECK(*e == sample());
  CHECK(back.to_json() == c.to_json());

  // Saving again over the file replaces it atomically and still leaves no temp files.
  c.save(path);
  c.save(path);
  CHECK(list_dir(dir) == std::vector<std::string>{"tuning.json"});
  CHECK(TuningCache::load(path, h200()).entries() == c.entries());

  // A bare file name is written in the current directory.
  char cwd[4096];
  REQUIRE(getcwd(cwd, sizeof cwd) != nullptr);
  REQUIRE(chdir(base.c_str()) == 0);
  CHECK_NOTHROW(c.save("plain.json"));
  REQUIRE(chdir(cwd) == 0);
  CHECK(TuningCache::load(base + "/plain.json", h200()).entries() == c.entries());
}

TEST_CASE("tuning cache: head groups are written only when used, files without them load") {
  ScopedEnv quiet("ROPEJIT_QUIET", "1");
  TuningCache c = golden_cache();
  TuningEntry grouped = entry(bf16_key(), 16, 32, 8, 8, 1, 512, 10, 1, 0, 1.5, 200.0, 1.7);
  grouped.config.head_groups = 4;
  c.put(grouped);
  const json doc = c.to_json();
  int with_groups = 0;
  for (const json& e : doc.at("entries")) {
    const bool has = e.at("config").contains("head_groups");
    with_groups += has;
    CHECK(has == (e.at("bucket") == 16));
  }
  CHECK(with_groups == 1);
  const std::string path = temp_dir() + "/tuning.json";
  c.save(path);
  const TuningCache back = TuningCache::load(path, h200());
  CHECK(back.warnings().empty());
  const TuningEntry* e = back.find(bf16_key(), 16, 32, 8);
  REQUIRE(e != nullptr);
  CHECK(e->config.head_groups == 4);
  CHECK(e->config.name() == "v8h1t512_r10_z1_g0_y4");
  // The golden file (written before head groups existed) has none: every entry reads as 1.
  const TuningCache golden =
      TuningCache::load(std::string(ROPEJIT_GOLDEN_DIR) + "/tuning_v1.json", h200());
  for (const TuningEntry& g : golden.entries()) CHECK(g.config.head_groups == 1);
}

TEST_CASE("tuning cache: projection paths round trip, are validated, and are optional") {
  ScopedEnv quiet("ROPEJIT_QUIET", "1");
  const std::string key = "qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms";
  TuningCache c = golden_cache();
  CHECK_FALSE(c.to_json().contains("projections"));  // written only when there are some
  ProjTuningEntry p;
  p.key = key;
  p.bucket = 64;
  p.hidden = 4096;
  p.columns = 6144;
  p.path = ProjPath::unfused;
  p.fused_us = 59.2;
  p.unfused_us = 36.0;
  c.put(p);
  ProjTuningEntry q = p;
  q.bucket = 8;
  q.path = ProjPath::fused;
  q.variant = "m1s8u2c4";  // the fused kernel's tuned variant
  c.put(q);
  q.fused_us = 25.0;
  c.put(q);  // same slot: replaced
  REQUIRE(c.proj_entries().size() == 2);
  CHECK(c.proj_entries()[0].bucket == 8);  // sorted
  const std::string path = temp_dir() + "/tuning.json";
  c.save(path);
  const TuningCache back = TuningCache::load(path, h200());
  CHECK(back.warnings().empty());
  CHECK(back.proj_entries() == c.proj_entries());
  CHECK(back.entries() == c.entries());
  const ProjTuningEntry* found = back.find_proj(key, 64, 4096, 6144);
  REQUIRE(found != nullptr);
  CHECK(found->path == ProjPath::unfused);
  CHECK(found->variant.empty());
  CHECK(back.find_proj(key, 8, 4096, 6144)->variant == "m1s8u2c4");
  CHECK(back.find_proj(key, 64, 4096, 5120) == nullptr);
  CHECK_FALSE(c.to_json().at("projections")[1].contains("variant"));  // written only when set
  // Saving a cache without projections keeps the file's.
  golden_cache().save(path);
  CHECK(TuningCache::load(path, h200()).proj_entries().size() == 2);

  // Bad projection entries are skipped, each with a warning naming the field; the rest load.
  json doc = c.to_json();
  json bad = doc.at("projections")[0];
  const std::pair<std::function<void(json&)>, const char*> cases[] = {
      {[](json& j) { j["path"] = "fast"; }, "field 'path' (fast) must be"},
      {[](json& j) { j["bucket"] = 3; }, "bucket (3) must be a power of two"},
      {[](json& j) { j["hidden"] = 12; }, "hidden (12) must be a multiple of 8"},
      {[](json& j) { j["columns"] = 0; }, "columns (0) must be in 1..2^31"},
      {[](json& j) { j["key"] = "rope_bshd"; }, "key: "},
      {[](json& j) { j["fused_us"] = -1.0; }, "fused_us (-1) must be finite"},
      {[](json& j) { j["extra"] = 1; }, "unknown field 'extra'"},
      {[](json& j) { j.erase("unfused_us"); }, "missing field 'unfused_us'"},
      {[](json& j) { j["variant"] = "fast"; }, "variant (fast) is not a projection variant name"},
      {[](json& j) { j["variant"] = "m1s8u2c1"; }, "variant (m1s8u2c1) is not a projection"},
      {[](json& j) { j["variant"] = "m3s4u2"; }, "variant (m3s4u2): token_tiles (3) must be"},
      {[](json& j) { j["variant"] = "m8s4u4"; }, "variant (m8s4u4): token_tiles (8) x unroll (4)"},
      {[](json& j) { j["variant"] = 7; }, "field 'variant'"},
  };
  for (const auto& [edit, expect] : cases) {
    json d = doc;
    json e = bad;
    edit(e);
    d["projections"].push_back(e);
    const TuningCache t = TuningCache::parse(d.dump(), h200());
    CHECK(t.proj_entries().size() == 2);
    REQUIRE(t.warnings().size() == 1);
    CHECK_MESSAGE(t.warnings()[0].find(expect) != std::string::npos, t.warnings()[0]);
    CHECK(t.warnings()[0].find("projection entry 2") != std::string::npos);
  }
  json d = doc;
  d["projections"] = 5;
  CHECK_THROWS_WITH_AS(TuningCache::parse(d.dump(), h200()),
                       doctest::Contains("field 'projections' must be an array"), Error);
}

TEST_CASE("tuning cache: schema 1 is frozen by a golden file") {
  const std::string golden = std::string(ROPEJIT_GOLDEN_DIR) + "/tuning_v1.json";
  const TuningCache c = golden_cache();
  const std::string text = c.to_json().dump(2) + "\n";
  if (std::getenv("ROPEJIT_UPDATE_GOLDEN")) write_file(golden, text);
  CHECK(read_file(golden) == text);

  const TuningCache back = TuningCache::load(golden, h200());
  CHECK(back.warnings().empty());
  CHECK(back.fingerprint() == h200());
  REQUIRE(back.entries().size() == 4);
  CHECK(back.entries() == c.entries());
  const TuningEntry* big = back.find(f32_key(), 2147483648LL, 8, 0);
  REQUIRE(big != nullptr);
  CHECK(big->config.kernel.max_threads == 1024);
  CHECK(big->default_us == 123456.75);

  // save() writes exactly the golden bytes.
  const std::string path = temp_dir() + "/tuning.json";
  c.save(path);
  CHECK(read_file(path) == read_file(golden));
}

TEST_CASE("tuning cache: a missing file is an empty cache without warnings") {
  const std::string dir = temp_dir();
  const TuningCache c = TuningCache::load(dir + "/absent.json", h200());
  CHECK(c.entries().empty());
  CHECK(c.warnings().empty());
  CHECK(c.fingerprint() == h200());
  CHECK(TuningCache::load("", h200()).warnings().empty());
}

TEST_CASE("tuning cache: unusable files give an empty cache and one warning") {
  ScopedEnv quiet("ROPEJIT_QUIET", "1");
  const std::string dir = temp_dir();
  const std::string good = golden_cache().to_json().dump(2);
  json wrong_schema = json::parse(good);
  wrong_schema["schema"] = 2;
  wrong_schema["new_field"] = true;  // a newer file reports its version, not this field
  json no_schema = json::parse(good);
  no_schema.erase("schema");
  json string_schema = json::parse(good);
  string_schema["schema"] = "1";
  json extra_top = json::parse(good);
  extra_top["comment"] = "hi";
  json bad_fingerprint = json::parse(good);
  bad_fingerprint["fingerprint"]["cc"] = "90";
  json fingerprint_extra = json::parse(good);
  fingerprint_extra["fingerprint"]["uuid"] = "GPU-1";
  json entries_object = json::parse(good);
  entries_object["entries"] = json::object();

  const std::pair<std::string, std::string> cases[] = {
      {"{\"schema\": 1, \"fingerprint\": {", "invalid JSON"},
      {good.substr(0, good.size() / 2), "invalid JSON"},  // truncated
      {"", "invalid JSON"},
      {"[1, 2]", "expected a JSON object, got array"},
      {wrong_schema.dump(), "schema version 2 (this library reads 1)"},
      {no_schema.dump(), "no schema version"},
      {string_schema.dump(), "schema version \"1\""},
      {extra_top.dump(), "unknown field 'comment'"},
      {bad_fingerprint.dump(), "field 'fingerprint.cc' must be an integer, got string"},
      {fingerprint_extra.dump(), "unknown field 'fingerprint.uuid'"},
      {entries_object.dump(), "field 'entries' must be an array, got object"},
  };
  int n = 0;
  for (const auto& [text, reason] : cases) {
    const std::string path = dir + "/t" + std::to_string(n++) + ".json";
    write_file(path, text);
    INFO(path, " should fail with: ", reason);
    const TuningCache c = TuningCache::load(path, h200());
    CHECK(c.entries().empty());
    CHECK(c.fingerprint() == h200());
    REQUIRE(c.warnings().size() == 1);
    INFO(c.warnings()[0]);
    CHECK(contains(c.warnings()[0], path));
    CHECK(contains(c.warnings()[0], reason));
  }

  // A directory where the file should be cannot be read.
  REQUIRE(mkdir((dir + "/isdir.json").c_str(), 0700) == 0);
  const TuningCache c = TuningCache::load(dir + "/isdir.json", h200());
  CHECK(c.entries().empty());
  REQUIRE(c.warnings().size() == 1);
  CHECK(contains(c.warnings()[0], "is a directory"));
}

TEST_CASE("tuning cache: entries are used only on the GPU they were measured on") {
  ScopedEnv quiet("ROPEJIT_QUIET", "1");
  const std::string path = temp_dir() + "/tuning.json";
  golden_cache().save(path);

  Fingerprint other_name = h200(), other_cc = h200(), other_sms = h200();
  other_name.gpu_name = "NVIDIA H100 80GB HBM3";
  other_cc.cc = 100;
  other_sms.sm_count = 114;
  for (const Fingerprint& here : {other_name, other_cc, other_sms}) {
    const TuningCache c = TuningCache::load(path, here);
    CHECK(c.entries().empty());
    CHECK(c.fingerprint() == here);
    REQUIRE(c.warnings().size() == 1);
    CHECK(contains(c.warnings()[0], path));
    CHECK(contains(c.warnings()[0], "tuned on NVIDIA H200 (sm_90, 132 SMs)"));
  }

  // A newer driver, NVRTC or library reuses the entries; the fingerprint stays the file's.
  Fingerprint upgraded = h200();
  upgraded.driver_version = 13010;
  upgraded.nvrtc = "13.1";
  upgraded.library = "0.2.0";
  CHECK(upgraded.same_gpu(h200()));
  CHECK_FALSE(upgraded == h200());
  const TuningCache c = TuningCache::load(path, upgraded);
  CHECK(c.warnings().empty());
  CHECK(c.entries().size() == 4);
  CHECK(c.fingerprint() == h200());
}

TEST_CASE("tuning cache: invalid entries are ignored and the rest kept") {
  ScopedEnv quiet("ROPEJIT_QUIET", "1");
  const std::string dir = temp_dir();
  const json good = sample_json();
  using Edit = std::function<void(json&)>;
  auto set = [](const char* field, json v) -> Edit { return [=](json& e) { e[field] = v; }; };
  auto set_config = [](const char* field, json v) -> Edit {
    return [=](json& e) { e["config"][field] = v; };
  };
  auto erase = [](const char* field) -> Edit { return [=](json& e) { e.erase(field); }; };

  Spec narrow;  // 4 rotary pairs: vectors of at most 4
  narrow.rotary_dim = 8;
  const std::pair<Edit, std::string> cases[] = {
      // Shape of the entry.
      {[](json& e) { e = 42; }, "entry must be an object, got integer"},
      {set("extra", 1), "unknown field 'extra'"},
      {set_config("foo", 1), "unknown field 'config.foo'"},
      {erase("key"), "missing field 'key'"},
      {erase("bucket"), "missing field 'bucket'"},
      {erase("q_heads"), "missing field 'q_heads'"},
      {erase("k_heads"), "missing field 'k_heads'"},
      {erase("config"), "missing field 'config'"},
      {erase("median_us"), "missing field 'median_us'"},
      {erase("gbps"), "missing field 'gbps'"},
      {erase("default_us"), "missing field 'default_us'"},
      {[](json& e) { e["config"].erase("rows"); }, "missing field 'config.rows'"},
      {[](json& e) { e["config"].erase("blocks_per_sm"); }, "missing field 'config.blocks_per_sm'"},
      // Types.
      {set("key", 7), "field 'key' must be a string, got integer"},
      {set("bucket", "64"), "field 'bucket' must be an integer, got string"},
      {set("bucket", 64.0), "field 'bucket' must be an integer, got number"},
      {set("q_heads", true), "field 'q_heads' must be an integer, got boolean"},
      {set("k_heads", nullptr), "field 'k_heads' must be an integer, got null"},
      {set("config", json::array()), "config must be an object, got array"},
      {set("median_us", "2.1"), "field 'median_us' must be a number, got string"},
      {set("gbps", json::object()), "field 'gbps' must be a number, got object"},
      {set_config("vec", "8"), "field 'config.vec' must be an integer, got string"},
      {set_config("max_threads", 256.5), "field 'config.max_threads' must be an integer"},
      // Keys.
      {set("key", "rope_nope"), "key: key 'rope_nope' is not a ropejit key"},
      {set("key", "rope_bshd_bf16_d128_r0_neox_pos-offset_tab-f32-half_qk_fwd_ip"),
       "is not canonical"},
      {set("key", ""), "key: "},
      // Ranges, field by field.
      {set("bucket", 0), "bucket (0) must be a power of two in 1..2^31"},
      {set("bucket", -64), "bucket (-64) must be a power of two"},
      {set("bucket", 48), "bucket (48) must be a power of two"},
      {set("bucket", int64_t(1) << 32), "must be a power of two in 1..2^31"},
      {set("bucket", UINT64_MAX), "field 'bucket' (18446744073709551615) is out of range"},
      {set("q_heads", 0), "q_heads (0) must be in 1..65536"},
      {set("q_heads", 65537), "q_heads (65537) must be in 1..65536"},
      {set("q_heads", int64_t(1) << 40), "field 'q_heads' (1099511627776) is out of range"},
      {set("k_heads", -1), "k_heads (-1) must be in 0..65536"},
      {set("k_heads", 65537), "k_heads (65537) must be in 0..65536"},
      {set_config("vec", 0), "config.vec (0) must be 1, 2, 4 or 8"},
      {set_config("vec", 3), "config.vec (3) must be 1, 2, 4 or 8"},
      {set_config("vec", 16), "config.vec (16) must be 1, 2, 4 or 8"},
      {set("key", f32_key()), "config.vec (8) exceeds 16 bytes of f32"},
      {set("key", narrow.key()), "config.vec (8) is wider than " + narrow.key() + " allows (4)"},
      {set_config("heads_per_thread", 0), "config.heads_per_thread (0) must be in 1..8"},
      {set_config("heads_per_thread", 9), "config.heads_per_thread (9) must be in 1..8"},
      {set_config("max_threads", 0), "config.max_threads (0) must be a multiple of 32"},
      {set_config("max_threads", 48), "config.max_threads (48) must be a multiple of 32"},
      {set_config("max_threads", 2048), "config.max_threads (2048) must be a multiple of 32"},
      {set_config("rows", 0), "config.rows (0) must be in 1..1024"},
      {set_config("rows", 1025), "config.rows (1025) must be in 1..1024"},
      {set_config("tokens_per_block", 0), "config.tokens_per_block (0) must be in 1..64"},
      {set_config("tokens_per_block", 65), "config.tokens_per_block (65) must be in 1..64"},
      {set_config("blocks_per_sm", -1), "config.blocks_per_sm (-1) must be in 0..32"},
      {set_config("blocks_per_sm", 33), "config.blocks_per_sm (33) must be in 0..32"},
      {set_config("head_groups", 0), "config.head_groups (0) must be in 1..64"},
      {set_config("head_groups", 65), "config.head_groups (65) must be in 1..64"},
      {set_config("head_groups", 11),
       "config.head_groups (11) leave blocks without heads: 40 heads in rows of 4"},
      {set_config("head_groups", 1.5), "field 'config.head_groups' must be an integer, got number"},
      {set_config("ring", 7), "config.ring (7) must be 0 or 2..4"},
      {set_config("ring", 2), "config.ring (2) is for fused keys"},
      {set_config("rows", 32), "config: 512 threads per block exceed max_threads (256)"},
      {[](json& e) {
         e["q_heads"] = 2;
         e["k_heads"] = 0;
       },
       "config: rows 4 exceed the 2 heads"},
      {[](json& e) {
         e["config"]["max_threads"] = 1024;
         e["config"]["rows"] = 32;
         e["config"]["tokens_per_block"] = 4;
         e["config"]["blocks_per_sm"] = 4;
       },
       "config: persistent blocks do not fit on one SM"},
      {set("median_us", -1.0), "median_us (-1) must be finite and >= 0"},
      {set("gbps", -0.5), "gbps (-0.5) must be finite and >= 0"},
      {set("default_us", -3), "default_us (-3) must be finite and >= 0"},
  };
  int n = 0;
  for (const auto& [edit, reason] : cases) {
    json bad = good;
    bad["bucket"] = 128;  // a different slot from `good`, so only validation can drop it
    edit(bad);
    const std::string path = dir + "/e" + std::to_string(n++) + ".json";
    write_file(path, document({good, bad}).dump(2));
    INFO(path, " should fail with: ", reason);
    const TuningCache c = TuningCache::load(path, h200());
    REQUIRE(c.entries().size() == 1);
    CHECK(c.entries()[0] == sample());
    REQUIRE(c.warnings().size() == 1);
    INFO(c.warnings()[0]);
    CHECK(contains(c.warnings()[0], "ignoring entry 1 of tuning file " + path));
    CHECK(contains(c.warnings()[0], reason));
  }

  // Numbers too large for a double are a defect of the whole file (nlohmann rejects them).
  const std::string inf_path = dir + "/inf.json";
  std::string text = document({good}).dump();
  const size_t at = text.find("2.5");
  REQUIRE(at != std::string::npos);
  write_file(inf_path, text.replace(at, 3, "1e999"));
  const TuningCache inf = TuningCache::load(inf_path, h200());
  CHECK(inf.entries().empty());
  REQUIRE(inf.warnings().size() == 1);
  CHECK(contains(inf.warnings()[0], "invalid JSON: number overflow parsing '1e999'"));

  // Several bad entries among good ones: each named by its index.
  json other = good;
  other["bucket"] = 4096;
  json wrong = good;
  wrong["rows"] = 4;  // misplaced: belongs in config
  const std::string path = dir + "/mixed.json";
  write_file(path, document({wrong, good, 42, other}).dump());
  const TuningCache c = TuningCache::load(path, h200());
  CHECK(c.entries().size() == 2);
  REQUIRE(c.warnings().size() == 2);
  CHECK(contains(c.warnings()[0], "ignoring entry 0 of tuning file " + path));
  CHECK(contains(c.warnings()[0], "unknown field 'rows'"));
  CHECK(contains(c.warnings()[1], "ignoring entry 2 of tuning file " + path));
}

TEST_CASE("tuning cache: save merges with the file, this cache winning") {
  ScopedEnv quiet("ROPEJIT_QUIET", "1");
  const std::string dir = temp_dir();
  const std::string path = dir + "/tuning.json";
  golden_cache().save(path);

  TuningCache newer;
  newer.set_fingerprint(h200());
  TuningEntry replaced = sample();
  replaced.config.kernel.heads_per_thread = 4;
  replaced.median_us = 1.9;
  TuningEntry added = sample();
  added.bucket = 1024;
  newer.put(replaced);
  newer.put(added);
  newer.save(path);
  CHECK(list_dir(dir) == std::vector<std::string>{"tuning.json"});

  const TuningCache merged = TuningCache::load(path, h200());
  CHECK(merged.warnings().empty());
  CHECK(merged.entries().size() == 5);
  CHECK(*merged.find(sample().key, 64, 32, 8) == replaced);
  CHECK(*merged.find(sample().key, 1024, 32, 8) == added);
  const TuningCache before = golden_cache();
  for (const TuningEntry& e : before.entries()) {
    const TuningEntry* kept = merged.find(e.key, e.bucket, e.q_heads, e.k_heads);
    REQUIRE(kept != nullptr);
    if (!(e.bucket == 64 && e.key == sample().key)) CHECK(*kept == e);
  }

  // The file's entries for another GPU are dropped, and the file now names this one.
  Fingerprint h100 = h200();
  h100.gpu_name = "NVIDIA H100 80GB HBM3";
  h100.sm_count = 132;
  TuningCache other;
  other.set_fingerprint(h100);
  other.put(added);
  other.save(path);
  const TuningCache on_h100 = TuningCache::load(path, h100);
  CHECK(on_h100.warnings().empty());
  CHECK(on_h100.fingerprint() == h100);
  CHECK(on_h100.entries() == std::vector<TuningEntry>{added});
  CHECK(TuningCache::load(path, h200()).entries().empty());

  // An unusable file is replaced.
  write_file(path, "{ not json");
  newer.save(path);
  CHECK(TuningCache::load(path, h200()).entries() == newer.entries());
}

TEST_CASE("tuning cache: save failures throw naming the path") {
  ScopedEnv quiet("ROPEJIT_QUIET", "1");
  const std::string base = temp_dir();
  const TuningCache c = golden_cache();
  auto expect_failure = [&](const std::string& path, const char* why) {
    INFO(path);
    try {
      c.save(path);
      FAIL("save did not throw");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::invalid_argument);
      CHECK(contains(e.what(), "cannot write tuning file " + path));
      CHECK(contains(e.what(), why));
    }
  };
  write_file(base + "/file", "x");
  expect_failure(base + "/file/sub/tuning.json", "Not a directory");
  expect_failure(base + "/file/tuning.json", "is not a directory");
  REQUIRE(mkdir((base + "/taken").c_str(), 0700) == 0);
  REQUIRE(mkdir((base + "/taken/tuning.json").c_str(), 0700) == 0);
  expect_failure(base + "/taken/tuning.json", "Is a directory");  // rename onto a directory
  CHECK(list_dir(base + "/taken") == std::vector<std::string>{"tuning.json"});  // temp removed
  if (geteuid() != 0) {  // root ignores permission bits
    REQUIRE(mkdir((base + "/ro").c_str(), 0500) == 0);
    expect_failure(base + "/ro/tuning.json", "Permission denied");
    expect_failure(base + "/ro/sub/tuning.json", "Permission denied");
  }
  CHECK_THROWS_AS(c.save(""), Error);
}

TEST_CASE("tuning cache: default path") {
  {
    ScopedEnv file("ROPEJIT_TUNING_FILE", "/somewhere/mine.json");
    CHECK(default_tuning_path() == "/somewhere/mine.json");
  }
  {
    ScopedEnv file("ROPEJIT_TUNING_FILE", "off");
    CHECK(default_tuning_path().empty());
  }
  ScopedEnv file("ROPEJIT_TUNING_FILE", std::nullopt);
  {
    ScopedEnv cache("ROPEJIT_CACHE_DIR", "/cache/dir");
    CHECK(default_tuning_path() == "/cache/dir/tuning.json");
    CHECK(default_tuning_path() == detail::DiskCache::default_dir() + "/tuning.json");
  }
  {
    ScopedEnv cache("ROPEJIT_CACHE_DIR", "off");
    CHECK(default_tuning_path().empty());
  }
  ScopedEnv cache("ROPEJIT_CACHE_DIR", std::nullopt);
  ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
  CHECK(default_tuning_path() == "/xdg/ropejit/tuning.json");
}

TEST_CASE(
    "tuning cache: a fused key's entry is valid whatever its narrow flag (each call decides)") {
  // The tuner times a fused key with the narrow variant its buffers allow; its entry must be
  // accepted and written without the flag, which is not part of the file.
  const std::string key = qwen3_dynamic_fp8_key();
  TuningEntry e = entry(key, 4096, 32, 8, 8, 1, 256, 2, 8, 0, 40.3, 1767.6, 40.3);
  CHECK(invalid_entry_reason(e) == "");
  e.config.kernel.narrow = true;
  CHECK(invalid_entry_reason(e) == "");
  TuningCache c;
  c.set_fingerprint(h200());
  c.put(e);
  const TuningCache back = TuningCache::parse(c.to_json().dump(), h200());
  CHECK(back.warnings().empty());
  CHECK(back.entries().size() == 1);
}

TEST_CASE("tuning cache: a ring variant's slots round trip, written only when used") {
  ScopedEnv quiet("ROPEJIT_QUIET", "1");
  const std::string key = qwen3_dynamic_fp8_key();
  TuningCache c;
  c.set_fingerprint(h200());
  TuningEntry ringed = entry(key, 32768, 32, 8, 8, 2, 128, 2, 8, 0, 170.0, 1800.0, 172.0);
  ringed.config.kernel.ring = 4;
  CHECK(invalid_entry_reason(ringed) == "");
  c.put(ringed);
  c.put(entry(key, 4096, 32, 8, 8, 2, 256, 2, 8, 0, 29.0, 1700.0, 29.0));
  const json doc = c.to_json();
  for (const json& e : doc.at("entries"))
    CHECK(e.at("config").contains("ring") == (e.at("bucket") == 32768));
  const TuningCache back = TuningCache::parse(doc.dump(), h200());
  CHECK(back.warnings().empty());
  const TuningEntry* e = back.find(key, 32768, 32, 8);
  REQUIRE(e != nullptr);
  CHECK(e->config.kernel.ring == 4);
  CHECK(e->config.name() == "v8h2t128a4_r2_z8_g0");
  REQUIRE(back.find(key, 4096, 32, 8) != nullptr);
  CHECK(back.find(key, 4096, 32, 8)->config.kernel.ring == 0);
  // Past 48 KB (256 threads of four slots: 64 KB): valid in the file; each call checks its own
  // GPU's grant before using it.
  TuningEntry large = entry(key, 65536, 32, 8, 8, 2, 256, 4, 8, 0, 340.0, 1800.0, 345.0);
  large.config.kernel.ring = 4;
  CHECK(detail::shared_bytes(parse_key(key), large.config) == 65536);
  CHECK(invalid_entry_reason(large) == "");
  ringed.config.kernel.ring = 1;
  CHECK(invalid_entry_reason(ringed) == "config.ring (1) must be 0 or 2..4");
}
