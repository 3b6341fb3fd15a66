#include <doctest/doctest.h>

#include <gflow/exchanger.hpp>
#include <gflow/timeline.hpp>
#include <gflow/transport/inproc.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace gflow;

namespace {
std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

const Layout& tl_layout() {
  static const Layout l = Layout::from_sizes({300, 7, 1024, 64, 1, 513, 2048, 5, 90});
  return l;
}

template <class E>
void traced_run(int P, int iters, const std::string& path, std::vector<std::size_t>& buckets_out) {
  buckets_out.assign(static_cast<std::size_t>(P), 0);
  inproc::run(P, [&](inproc::transport& t) {
    typename E::template on<inproc::transport> ex(t, tl_layout());
    timeline tl(4096);
    ex.set_timeline(&tl);
    tl.start(t);
    for (int it = 0; it < iters; ++it) {
      for (std::size_t i = tl_layout().size(); i-- > 0;) {
        for (float& v : ex.view(i)) v = 1.0f + static_cast<float>(t.rank());
        ex.ready(i);
      }
      CHECK(ex.finish().finite());
    }
    buckets_out[static_cast<std::size_t>(t.rank())] = ex.buckets().size();
    CHECK(tl.dropped() == 0);
    tl.write_chrome_trace(t, path);
  });
}
}  // namespace

TEST_CASE("timeline: every rank's ready, launch, bucket, stage, finish and iteration events land in one Chrome trace") {
  const std::string path = (std::filesystem::temp_directory_path() / "gflow_test_trace.json").string();
  const int P = 3, iters = 2;
  std::vector<std::size_t> nb;
  SUBCASE("Funneled, fp16 wire (cast, collective, widen)") {
    traced_run<Exchanger<Precision<half>, Fusion<2048>, Overlap<Funneled>>>(P, iters, path, nb);
  }
  SUBCASE("None, fp32 wire") { traced_run<Exchanger<Fusion<2048>>>(P, iters, path, nb); }
  SUBCASE("Chained") { traced_run<Exchanger<Precision<bfloat16>, Fusion<2048>, Overlap<Chained>>>(P, iters, path, nb); }
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string j = ss.str();
  REQUIRE(j.rfind("{\"displayTimeUnit\"", 0) == 0);
  CHECK(j.find("\"traceEvents\":[") != std::string::npos);
  CHECK(j.substr(j.size() - 4) == "\n]}\n");
  const std::size_t n = tl_layout().size();
  for (int r = 0; r < P; ++r) {
    const std::string pid = "\"pid\":" + std::to_string(r) + ",";
    CHECK(count(j, "\"args\":{\"name\":\"rank " + std::to_string(r) + "\"}") == 1);
    // every event of rank r carries its pid; count by category on the whole file then divide
    CHECK(count(j, pid) >= n * iters);
  }
  const std::size_t buckets = nb[0];
  CHECK(count(j, "\"cat\":\"ready\"") == P * iters * n);
  CHECK(count(j, "\"cat\":\"launch\"") == P * iters * buckets);
  CHECK(count(j, "\"cat\":\"bucket\"") == P * iters * buckets);
  CHECK(count(j, "\"cat\":\"collective\"") == P * iters * buckets);
  CHECK(count(j, "\"cat\":\"widen+average\"") == P * iters * buckets);
  CHECK(count(j, "\"cat\":\"finish\"") == P * iters);
  CHECK(count(j, "\"cat\":\"iteration\"") == P * iters);
  // balanced braces: a JSON object a trace viewer can load
  CHECK(count(j, "{") == count(j, "}"));
  CHECK(count(j, "[") == count(j, "]"));
  std::filesystem::remove(path);
}

TEST_CASE("timeline: off by default, detachable, counts what does not fit instead of allocating") {
  inproc::run(2, [&](inproc::transport& t) {
    Exchanger<Fusion<2048>>::on<inproc::transport> ex(t, tl_layout());
    CHECK(ex.attached_timeline() == nullptr);
    timeline tl(5);
    ex.set_timeline(&tl);
    for (std::size_t i = tl_layout().size(); i-- > 0;) ex.ready(i);
    CHECK_THROWS_AS(ex.set_timeline(nullptr), usage_error);  // mid-iteration: refused (here all are ready, finish not yet called)
    (void)ex.finish();
    CHECK(tl.size() == 5);
    CHECK(tl.dropped() > 0);
    ex.set_timeline(nullptr);
    tl.clear();
    for (std::size_t i = tl_layout().size(); i-- > 0;) ex.ready(i);
    (void)ex.finish();
    CHECK(tl.size() == 0);
  });
  CHECK_THROWS_AS(timeline(0), invalid_argument);
}
