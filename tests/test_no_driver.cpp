// Without a driver: everything but the launch works, and GPU calls fail with one clear
// message. On a machine with a driver these cases check the opposite and stay meaningful.
#include <doctest/doctest.h>

#include <string>

#include "jit/driver.hpp"
#include "ropejit/ropejit.h"
#include "ropejit/ropejit.hpp"

using namespace ropejit;

TEST_CASE("no driver: a valid call fails with one clear message") {
  std::string why;
  const bool have_driver = detail::try_driver(&why) != nullptr;
  const Info i = info();
  if (have_driver) {
    CHECK(i.driver_status == "ok");
    CHECK(i.driver_version > 0);
    return;
  }
  CHECK(why.find("libcuda.so.1") != std::string::npos);
  CHECK(i.driver_status == why);
  CHECK(i.driver_version == 0);
  CHECK(i.devices.empty());

  Spec s;
  Args a;
  a.batch = 1;
  a.seq_len = 4;
  a.q = contiguous(s.layout, reinterpret_cast<void*>(0x10000), 1, 4, 2, 128);
  a.cos = reinterpret_cast<void*>(0x20000);
  a.sin = reinterpret_cast<void*>(0x30000);
  a.table_rows = 16;
  try {
    apply(s, a);
    FAIL("apply succeeded without a driver");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::no_driver);
    CHECK(std::string(e.what()) == "ropejit: " + why);
  }
  ropejit_spec cs;
  ropejit_spec_init(&cs);
  ropejit_args ca;
  ropejit_args_init(&ca);
  ca.seq_len = 4;
  ca.q = ropejit_contiguous(ROPEJIT_LAYOUT_BSHD, reinterpret_cast<void*>(0x10000), 1, 4, 2, 128);
  ca.cos = reinterpret_cast<void*>(0x20000);
  ca.sin = reinterpret_cast<void*>(0x30000);
  ca.table_rows = 16;
  CHECK(ropejit_apply(&cs, &ca) == ROPEJIT_ERROR_NO_DRIVER);
  CHECK(std::string(ropejit_last_error()).find("libcuda.so.1") != std::string::npos);
}

TEST_CASE("no driver: precompiling still works") {
  Spec s;
  s.dtype = DType::f32;
  s.head_dim = 64;
  const std::vector<std::string> files = precompile(s, "sm_90");  // prefill's and decode's
  REQUIRE(files.size() == 2);
  CHECK(files[0].find(".rjk") != std::string::npos);
  CHECK(files[1].find(".rjk") != std::string::npos);
  CHECK(files[0] != files[1]);
}
