// Speaker-verification scoring (kernels/verification/verification.h): EER, minDCF and DET points against scikit-learn
// (tests/data/verification/cases.json, written by tools/gen_verification_fixtures.py) and against brute-force loops;
// trial generation and trial lists; cosine and AS-norm scores against naive loops; the DET picture.
#include <catch2/catch.hpp>
#include "melforge_test_paths.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "melforge/common/errors.h"
#include "test_util.h"
#include "verification/verification.h"

namespace melforge_test_verification {

namespace vf = melforge::verification;
using melforge::FormatError;
using melforge::InvalidArgument;
using melforge::IoError;

namespace {

constexpr double kTol = 1e-6;
constexpr double kInf = std::numeric_limits<double>::infinity();

nlohmann::json load_cases() {
  std::ifstream in(std::string(MELFORGE_TEST_DATA_DIR) + "/verification/cases.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in)["cases"];
}

/// `got` equals `want` (a number, or null for +inf) within kTol.
void check_value(double got, const nlohmann::json& want, const std::string& what) {
  CAPTURE(what, got, want.dump());
  if (want.is_null()) CHECK(got == kInf);
  else CHECK(got == Approx(want.get<double>()).margin(kTol).epsilon(0));
}

/// Scores of `n` trials, about half of them targets: targets ~ N(sep, 1), non-targets ~ N(0, 1), rounded to
/// multiples of `step` when step > 0 (ties).
void random_trials(std::size_t n, uint32_t seed, double step, std::vector<float>& scores,
                   std::vector<uint8_t>& targets) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> noise(0, 1);
  scores.clear();
  targets.clear();
  for (std::size_t i = 0; i < n; ++i) {
    const bool target = i == 0 || (i > 1 && (rng() & 1));
    double s = noise(rng) + (target ? 1.2 : 0.0);
    if (step > 0) s = std::round(s / step) * step;
    scores.push_back(static_cast<float>(s));
    targets.push_back(target ? 1 : 0);
  }
}

/// (p_fa, p_miss) of the rule "score >= t", counted directly.
std::pair<double, double> rates_at(const std::vector<float>& scores, const std::vector<uint8_t>& targets, double t) {
  double fa = 0, miss = 0, pos = 0, neg = 0;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    if (targets[i]) pos += 1, miss += scores[i] < t;
    else neg += 1, fa += scores[i] >= t;
  }
  return {fa / neg, miss / pos};
}

/// Every row of `n` x `dim` random embeddings in [-1, 1].
std::vector<float> random_embeddings(int64_t n, int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> e(static_cast<std::size_t>(n * dim));
  for (float& x : e) x = u(rng);
  return e;
}

double naive_cosine(const std::vector<float>& e, int64_t dim, int64_t a, const std::vector<float>& f, int64_t b) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t k = 0; k < dim; ++k) {
    const double x = e[static_cast<std::size_t>(a * dim + k)], y = f[static_cast<std::size_t>(b * dim + k)];
    ab += x * y, aa += x * x, bb += y * y;
  }
  return ab / std::sqrt(aa * bb);
}

}  // namespace

TEST_CASE("EER, minDCF and the DET curve equal scikit-learn's on the fixtures", "[verification]") {
  const nlohmann::json cases = load_cases();
  REQUIRE(cases.size() >= 8);
  const std::size_t i = GENERATE_COPY(range(std::size_t{0}, cases.size()));
  const nlohmann::json& c = cases[i];
  CAPTURE(c["name"].get<std::string>());
  const auto doubles = c["scores"].get<std::vector<double>>();
  const std::vector<float> scores(doubles.begin(), doubles.end());
  const auto targets = c["targets"].get<std::vector<uint8_t>>();
  const nlohmann::json& e = c["expected"];

  const std::vector<vf::DetPoint> det = vf::det_curve(scores, targets);
  REQUIRE(det.size() == e["det"]["p_fa"].size());
  for (std::size_t k = 0; k < det.size(); ++k) {
    check_value(det[k].threshold, e["det"]["threshold"][k], "threshold " + std::to_string(k));
    check_value(det[k].p_fa, e["det"]["p_fa"][k], "p_fa " + std::to_string(k));
    check_value(det[k].p_miss, e["det"]["p_miss"][k], "p_miss " + std::to_string(k));
  }
  const vf::ErrorRates r = vf::error_rates(scores, targets);
  check_value(r.eer, e["eer"], "EER");
  check_value(r.eer_threshold, e["eer_threshold"], "EER threshold");
  check_value(r.min_dcf_01, e["min_dcf_01"], "minDCF 0.01");
  check_value(r.min_dcf_01_threshold, e["min_dcf_01_threshold"], "minDCF 0.01 threshold");
  check_value(r.min_dcf_05, e["min_dcf_05"], "minDCF 0.05");
  check_value(r.min_dcf_05_threshold, e["min_dcf_05_threshold"], "minDCF 0.05 threshold");
  CHECK(r.targets + r.nontargets == static_cast<int64_t>(scores.size()));
  CHECK(r.targets == std::count(targets.begin(), targets.end(), 1));
}

TEST_CASE("DET points, EER and minDCF equal brute-force loops over thresholds", "[verification]") {
  const std::size_t n = GENERATE(2, 3, 10, 101, 400);
  const uint32_t seed = GENERATE(1u, 2u, 3u);
  const double step = GENERATE(0.0, 0.5);
  CAPTURE(n, seed, step);
  std::vector<float> scores;
  std::vector<uint8_t> targets;
  random_trials(n, seed, step, scores, targets);
  const std::vector<vf::DetPoint> det = vf::det_curve(scores, targets);

  std::set<float, std::greater<>> distinct(scores.begin(), scores.end());
  REQUIRE(det.size() == distinct.size() + 1);
  CHECK(det[0].threshold == kInf);
  CHECK(det[0].p_fa == 0);
  CHECK(det[0].p_miss == 1);
  std::size_t k = 1;
  for (const float t : distinct) {
    const auto [fa, miss] = rates_at(scores, targets, t);
    CHECK(det[k].threshold == t);
    CHECK(det[k].p_fa == Approx(fa).margin(1e-12));
    CHECK(det[k].p_miss == Approx(miss).margin(1e-12));
    ++k;
  }

  double eer_naive = -1, lower = 0, upper = 1;
  for (std::size_t j = 0; j < det.size(); ++j) {
    lower = std::max(lower, std::min(det[j].p_fa, det[j].p_miss));
    upper = std::min(upper, std::max(det[j].p_fa, det[j].p_miss));
    if (j == 0 || eer_naive >= 0) continue;
    const double x0 = det[j - 1].p_fa, y0 = det[j - 1].p_miss, x1 = det[j].p_fa, y1 = det[j].p_miss;
    const double denom = (x1 - x0) - (y1 - y0);
    if (denom == 0) continue;
    const double t = (y0 - x0) / denom;
    if (t >= 0 && t <= 1) eer_naive = x0 + t * (x1 - x0);
  }
  const vf::ErrorRates r = vf::error_rates(scores, targets);
  CHECK(r.eer == Approx(eer_naive).margin(1e-12));
  CHECK(r.eer >= lower - 1e-12);
  CHECK(r.eer <= upper + 1e-12);

  for (const double p : {0.01, 0.05, 0.3}) {
    double best = p;
    for (const float t : distinct) {
      const auto [fa, miss] = rates_at(scores, targets, t);
      best = std::min(best, p * miss + (1 - p) * fa);
    }
    CHECK(vf::min_dcf(det, p) == Approx(best / std::min(p, 1 - p)).margin(1e-12));
  }
  CHECK(r.min_dcf_01 == vf::min_dcf(det, 0.01));
  CHECK(r.min_dcf_05 == vf::min_dcf(det, 0.05));
  CHECK(vf::min_dcf(det, 0.05, 2, 1) ==
        Approx([&] {
          double best = 2 * 0.05;
          for (const auto& q : det) best = std::min(best, 2 * 0.05 * q.p_miss + 0.95 * q.p_fa);
          return best / (2 * 0.05);
        }()).margin(1e-12));
}

TEST_CASE("error rates refuse mismatched sizes, one-sided trials, NaN scores and bad priors", "[verification]") {
  CHECK_THROWS_AS(vf::det_curve({0.1f, 0.2f}, {1}), InvalidArgument);
  CHECK_THROWS_AS(vf::det_curve({0.1f, 0.2f}, {1, 1}), InvalidArgument);
  CHECK_THROWS_AS(vf::det_curve({0.1f, 0.2f}, {0, 0}), InvalidArgument);
  CHECK_THROWS_AS(vf::det_curve({}, {}), InvalidArgument);
  CHECK_THROWS_WITH(vf::det_curve({0.1f, std::nanf("")}, {1, 0}), Catch::Contains("score 1"));
  const auto det = vf::det_curve({0.1f, 0.2f}, {1, 0});
  CHECK_THROWS_AS(vf::min_dcf(det, 0), InvalidArgument);
  CHECK_THROWS_AS(vf::min_dcf(det, 1), InvalidArgument);
  CHECK_THROWS_AS(vf::min_dcf(det, 0.01, 0), InvalidArgument);
  CHECK_THROWS_AS(vf::min_dcf({}, 0.01), InvalidArgument);
  CHECK_THROWS_AS(vf::equal_error_rate({}), InvalidArgument);

  const nlohmann::json j = vf::error_rates({0.9f, 0.1f, 0.5f}, {1, 0, 0}).to_json();
  CHECK(j["eer"] == 0.0);
  CHECK(j["eer_percent"] == 0.0);
  CHECK(j["targets"] == 1);
  CHECK(j["nontargets"] == 2);
  CHECK(j.contains("min_dcf_0.01"));
  CHECK(vf::error_rates({0.1f, 0.9f}, {1, 0}).to_json()["min_dcf_0.01_threshold"].is_null());
}

TEST_CASE("generated trials are balanced, distinct, labelled right and a function of the seed", "[verification]") {
  const int64_t classes = GENERATE(2, 3, 7);
  const int64_t per_class = GENERATE(2, 5);
  std::vector<int32_t> labels;
  for (int64_t f = 0; f < classes * per_class; ++f) labels.push_back(static_cast<int32_t>((f * 5 + 3) % classes));
  const int64_t files = static_cast<int64_t>(labels.size());
  const int64_t target_pairs = classes * per_class * (per_class - 1) / 2;
  const int64_t nontarget_pairs = files * (files - 1) / 2 - target_pairs;
  const int64_t most = 2 * std::min(target_pairs, nontarget_pairs);
  const int64_t count = GENERATE_COPY(values<int64_t>({2, most / 2 + most / 2 % 2, most}));
  CAPTURE(classes, per_class, count);

  const std::vector<vf::Trial> trials = vf::generate_trials(labels, count, 42);
  REQUIRE(static_cast<int64_t>(trials.size()) == count);
  std::set<std::pair<int64_t, int64_t>> pairs;
  int64_t targets = 0;
  for (const vf::Trial& t : trials) {
    CHECK(t.enroll >= 0);
    CHECK(t.enroll < t.test);
    CHECK(t.test < files);
    CHECK(t.target == (labels[static_cast<std::size_t>(t.enroll)] == labels[static_cast<std::size_t>(t.test)]));
    targets += t.target;
    pairs.emplace(t.enroll, t.test);
  }
  CHECK(targets == count / 2);
  CHECK(static_cast<int64_t>(pairs.size()) == count);
  CHECK(std::is_sorted(trials.begin(), trials.end(), [](const vf::Trial& a, const vf::Trial& b) {
    return std::pair{a.enroll, a.test} < std::pair{b.enroll, b.test};
  }));
  CHECK(vf::generate_trials(labels, count, 42) == trials);
  if (count < most) {
    bool differs = false;
    for (uint64_t seed = 43; seed < 53 && !differs; ++seed)
      differs = vf::generate_trials(labels, count, seed) != trials;
    CHECK(differs);
  }
}

TEST_CASE("trial generation reaches every pair, whatever the label values", "[verification]") {
  const std::vector<int32_t> labels = {7, -1, 7, 3, -1, 3, 3};
  std::set<std::pair<int64_t, int64_t>> seen;
  for (uint64_t seed = 0; seed < 200; ++seed)
    for (const vf::Trial& t : vf::generate_trials(labels, 2, seed)) seen.emplace(t.enroll, t.test);
  CHECK(seen.size() == 21);
}

TEST_CASE("trial generation draws every pair of a kind equally often", "[verification]") {
  const std::vector<int32_t> labels = {0, 1, 1, 1, 1, 1, 2, 2};
  std::map<std::pair<int64_t, int64_t>, int64_t> seen;
  const int64_t draws = 3400;
  for (uint64_t seed = 0; seed < static_cast<uint64_t>(draws); ++seed)
    for (const vf::Trial& t : vf::generate_trials(labels, 2, seed * 7919)) ++seen[{t.enroll, t.test}];
  REQUIRE(seen.size() == 28);
  for (const auto& [pair, n] : seen) {
    const bool target = labels[static_cast<std::size_t>(pair.first)] == labels[static_cast<std::size_t>(pair.second)];
    const double expected = static_cast<double>(draws) / (target ? 11.0 : 17.0);
    CAPTURE(pair.first, pair.second, target, n, expected);
    CHECK(std::abs(static_cast<double>(n) - expected) < 0.25 * expected);
  }
}

TEST_CASE("trial generation handles a corpus of VoxCeleb1-test size quickly", "[verification]") {
  std::vector<int32_t> labels;
  for (int32_t f = 0; f < 4800; ++f) labels.push_back(f % 40);
  const auto trials = vf::generate_trials(labels, 40000, 3);
  CHECK(trials.size() == 40000);
  CHECK(std::count_if(trials.begin(), trials.end(), [](const vf::Trial& t) { return t.target; }) == 20000);
}

TEST_CASE("trial generation refuses impossible requests before drawing", "[verification]") {
  CHECK_THROWS_WITH(vf::generate_trials({0, 0, 0}, 2, 1), Catch::Contains("at least 2 classes"));
  CHECK_THROWS_WITH(vf::generate_trials({0, 1, 2}, 2, 1), Catch::Contains("no class has 2 files"));
  CHECK_THROWS_WITH(vf::generate_trials({0, 0, 1, 1}, 3, 1), Catch::Contains("even"));
  CHECK_THROWS_WITH(vf::generate_trials({0, 0, 1, 1}, 0, 1), Catch::Contains("even"));
  CHECK_THROWS_WITH(vf::generate_trials({0, 0, 1, 1}, 6, 1), Catch::Contains("2 target and 4 non-target pairs"));
  CHECK_THROWS_WITH(vf::generate_trials({0, 0, 0, 1, 1}, 10, 1), Catch::Contains("4 target and 6 non-target"));
  CHECK_THROWS_AS(vf::generate_trials({}, 2, 1), InvalidArgument);
  CHECK(vf::generate_trials({0, 0, 1, 1}, 4, 1).size() == 4);
}

TEST_CASE("cosine scores equal a naive loop and refuse zero rows and bad indices", "[verification]") {
  const int64_t n = GENERATE(3, 9), dim = GENERATE(1, 3, 64);
  CAPTURE(n, dim);
  const std::vector<float> e = random_embeddings(n, dim, static_cast<uint32_t>(n * 100 + dim));
  std::vector<vf::Trial> trials;
  for (int64_t a = 0; a < n; ++a)
    for (int64_t b = 0; b < n; ++b) trials.push_back({a, b, a == b});
  const std::vector<float> s = vf::cosine_scores(e.data(), n, dim, trials);
  REQUIRE(s.size() == trials.size());
  for (std::size_t i = 0; i < trials.size(); ++i)
    CHECK(s[i] == Approx(naive_cosine(e, dim, trials[i].enroll, e, trials[i].test)).margin(1e-6));

  std::vector<float> z = e;
  std::fill(z.begin() + dim, z.begin() + 2 * dim, 0.0f);
  CHECK_THROWS_WITH(vf::cosine_scores(z.data(), n, dim, {{0, 1, false}}), Catch::Contains("row 1"));
  CHECK_NOTHROW(vf::cosine_scores(z.data(), n, dim, {{0, n - 1, false}}));
  CHECK_THROWS_WITH(vf::cosine_scores(e.data(), n, dim, {{0, 0, true}, {0, n, false}}), Catch::Contains("trial 1"));
  CHECK_THROWS_AS(vf::cosine_scores(e.data(), n, 0, trials), InvalidArgument);
}

TEST_CASE("AS-norm equals a naive loop over the cohort", "[verification]") {
  const int64_t n = 6, cohort_n = GENERATE(2, 11), dim = GENERATE(4, 32), top_k = GENERATE(2, 5, 50);
  CAPTURE(cohort_n, dim, top_k);
  const std::vector<float> e = random_embeddings(n, dim, 7), cohort = random_embeddings(cohort_n, dim, 8);
  const std::vector<vf::Trial> trials = {{0, 1, true}, {2, 3, false}, {1, 5, false}, {4, 0, true}, {3, 3, true}};
  const std::vector<float> got = vf::as_norm(e.data(), n, dim, trials, cohort.data(), cohort_n, top_k, 2);
  REQUIRE(got.size() == trials.size());
  const auto k = static_cast<std::size_t>(std::min(top_k, cohort_n));
  auto stats = [&](int64_t row) {
    std::vector<double> s;
    for (int64_t c = 0; c < cohort_n; ++c) s.push_back(naive_cosine(e, dim, row, cohort, c));
    std::sort(s.rbegin(), s.rend());
    double mean = 0, var = 0;
    for (std::size_t i = 0; i < k; ++i) mean += s[i] / static_cast<double>(k);
    for (std::size_t i = 0; i < k; ++i) var += (s[i] - mean) * (s[i] - mean) / static_cast<double>(k);
    return std::pair{mean, std::sqrt(var)};
  };
  for (std::size_t i = 0; i < trials.size(); ++i) {
    const double s = naive_cosine(e, dim, trials[i].enroll, e, trials[i].test);
    const auto [me, se] = stats(trials[i].enroll);
    const auto [mt, st] = stats(trials[i].test);
    CHECK(got[i] == Approx(0.5 * ((s - me) / se + (s - mt) / st)).epsilon(1e-5).margin(1e-5));
  }
}

TEST_CASE("AS-norm refuses a small top_k or cohort, zero cohort rows and a cohort without spread", "[verification]") {
  const int64_t dim = 4;
  const std::vector<float> e = random_embeddings(3, dim, 1), cohort = random_embeddings(4, dim, 2);
  const std::vector<vf::Trial> trials = {{0, 1, true}};
  CHECK_THROWS_WITH(vf::as_norm(e.data(), 3, dim, trials, cohort.data(), 4, 1), Catch::Contains("top_k"));
  CHECK_THROWS_WITH(vf::as_norm(e.data(), 3, dim, trials, cohort.data(), 1, 2), Catch::Contains("cohort"));
  std::vector<float> zero = cohort;
  std::fill(zero.begin() + 2 * dim, zero.begin() + 3 * dim, 0.0f);
  CHECK_THROWS_WITH(vf::as_norm(e.data(), 3, dim, trials, zero.data(), 4, 2), Catch::Contains("cohort row 2"));
  std::vector<float> same(static_cast<std::size_t>(4 * dim));
  for (std::size_t i = 0; i < same.size(); ++i) same[i] = cohort[i % static_cast<std::size_t>(dim)];
  CHECK_THROWS_WITH(vf::as_norm(e.data(), 3, dim, trials, same.data(), 4, 3), Catch::Contains("all equal"));
}

TEST_CASE("read_trials reads VoxCeleb lists and names the file, line and problem of a bad one", "[verification]") {
  melforge::test::TempDir d;
  const std::vector<std::string> paths = {"id1/a/1.wav", "id1/b/2.wav", "id2/c/3.wav"};
  const auto list = d / "trials.txt";
  melforge::test::write_text(list, "1 id1/a/1.wav id1/b/2.wav\n\n0\tid2/c/3.wav  id1/a/1.wav\r\n   \n");
  const std::vector<vf::Trial> trials = vf::read_trials(list, paths);
  CHECK(trials == std::vector<vf::Trial>{{0, 1, true}, {2, 0, false}});
  CHECK(vf::trial_targets(trials) == std::vector<uint8_t>{1, 0});

  const auto [text, message] = GENERATE(table<std::string, std::string>({
      {"1 id1/a/1.wav id1/b/2.wav\n1 id1/a/1.wav\n", "trials.txt:2: expected 3 fields"},
      {"1 id1/a/1.wav id1/b/2.wav x\n", "trials.txt:1: expected 3 fields 'LABEL ENROLL TEST', found 4"},
      {"\n2 id1/a/1.wav id1/b/2.wav\n", "trials.txt:2: the label must be 1 (target) or 0 (non-target), found '2'"},
      {"1 id1/a/1.wav id9/x.wav\n", "trials.txt:1: unknown path 'id9/x.wav'"},
      {"0 x.wav y.wav\n", "unknown path 'x.wav', 'y.wav'"},
      {"\n \n", "holds no trial"},
  }));
  CAPTURE(text);
  melforge::test::write_text(list, text);
  CHECK_THROWS_AS(vf::read_trials(list, paths), FormatError);
  CHECK_THROWS_WITH(vf::read_trials(list, paths), Catch::Contains(list.string()) && Catch::Contains(message));
}

TEST_CASE("read_trials refuses a missing file and a split with a path twice", "[verification]") {
  melforge::test::TempDir d;
  CHECK_THROWS_AS(vf::read_trials(d / "missing.txt", {"a.wav"}), IoError);
  melforge::test::write_text(d / "t.txt", "1 a.wav a.wav\n");
  CHECK_THROWS_WITH(vf::read_trials(d / "t.txt", {"a.wav", "b.wav", "a.wav"}), Catch::Contains("'a.wav' twice"));
}

TEST_CASE("trial paths resolve as the recipes write them: exactly, under --trials-root, absolute, or as a path's end",
          "[verification][trial_paths]") {
  const std::vector<std::string> stored = {"wav/id10270/5r0dWxy17C8/00001.wav", "wav/id10270/5r0dWxy17C8/00002.wav",
                                           "wav/id10300/ize_eiCFEg0/00003.wav", "other/id10300/ize_eiCFEg0/00003.wav",
                                           "x.wav"};
  const vf::TrialPathIndex index(stored);
  const auto [field, root, want] = GENERATE(table<std::string, std::string, int64_t>({
      {"wav/id10270/5r0dWxy17C8/00001.wav", "", 0},
      {"./wav/id10270/5r0dWxy17C8/00002.wav", "", 1},
      {"id10270/5r0dWxy17C8/00001.wav", "", 0},
      {"5r0dWxy17C8/00002.wav", "", 1},
      {"00001.wav", "", 0},
      {"id10300/ize_eiCFEg0/00003.wav", "wav", 2},
      {"id10300/ize_eiCFEg0/00003.wav", "other", 3},
      {"id10300/ize_eiCFEg0/00003.wav", "wav/", 2},
      {"00003.wav", "wav/id10300/ize_eiCFEg0", 2},
      {"/data/VoxCeleb1/wav/id10270/5r0dWxy17C8/00001.wav", "", 0},
      {"/data/VoxCeleb1/other/id10300/ize_eiCFEg0/00003.wav", "", 3},
      {"/mnt/x.wav", "", 4},
      {"id10300/ize_eiCFEg0/00003.wav", "/data/VoxCeleb1/other", 3},
      {"x.wav", "wav", 4},
  }));
  CAPTURE(field, root);
  const vf::TrialPathIndex::Match m = index.find(field, {root});
  CHECK(m.index == want);
  CHECK(m.ambiguous == 0);
}

TEST_CASE("a trial path that names several stored files, or none, is refused naming the list, line and field",
          "[verification][trial_paths]") {
  const std::vector<std::string> stored = {"wav/id1/v/1.wav", "dev/id1/v/1.wav", "wav/id2/v/2.wav"};
  const vf::TrialPathIndex index(stored);
  const vf::TrialPathIndex::Match m = index.find("id1/v/1.wav");
  CHECK(m.index == -1);
  CHECK(m.ambiguous == 2);
  CHECK(m.candidates == std::vector<std::string>{"wav/id1/v/1.wav", "dev/id1/v/1.wav"});
  CHECK(index.find("id9/v/1.wav").index == -1);
  CHECK(index.find("/elsewhere/id9/v/9.wav").index == -1);
  CHECK(index.find("d1/v/1.wav").index == -1);

  melforge::test::TempDir d;
  const auto list = d / "veri.txt";
  const auto [text, message] = GENERATE(table<std::string, std::string>({
      {"1 id2/v/2.wav id1/v/1.wav\n", "veri.txt:1: ambiguous path 'id1/v/1.wav' matches 2 files of the split ("
                                      "'wav/id1/v/1.wav', 'dev/id1/v/1.wav')"},
      {"1 wav/id1/v/1.wav wav/id2/v/2.wav\n\n0 id2/v/2.wav id3/v/3.wav\n", "veri.txt:3: unknown path 'id3/v/3.wav'"},
      {"0 /corpus/wav/id2/v/2.wav /corpus/wav/id7/v/1.wav\n", "veri.txt:1: unknown path '/corpus/wav/id7/v/1.wav'"},
  }));
  CAPTURE(text);
  melforge::test::write_text(list, text);
  CHECK_THROWS_AS(vf::read_trial_list(list, index), FormatError);
  CHECK_THROWS_WITH(vf::read_trial_list(list, index), Catch::Contains(message));
}

TEST_CASE("read_trial_list keeps each trial's fields as written and bounds the file and its lines",
          "[verification][trial_paths]") {
  const vf::TrialPathIndex index({"wav/id1/a/1.wav", "wav/id1/b/2.wav", "wav/id2/c/3.wav"});
  melforge::test::TempDir d;
  const auto list = d / "t.txt";
  melforge::test::write_text(list, "1 id1/a/1.wav /root/wav/id1/b/2.wav\r\n0 wav/id2/c/3.wav 1.wav\n");
  const vf::TrialList read = vf::read_trial_list(list, index);
  CHECK(read.trials == std::vector<vf::Trial>{{0, 1, true}, {2, 0, false}});
  CHECK(read.enroll == std::vector<std::string>{"id1/a/1.wav", "wav/id2/c/3.wav"});
  CHECK(read.test == std::vector<std::string>{"/root/wav/id1/b/2.wav", "1.wav"});

  SECTION("a line longer than kMaxTrialLineBytes is refused naming its line") {
    melforge::test::write_text(list, "1 id1/a/1.wav id1/b/2.wav\n1 id1/a/1.wav " +
                                         std::string(vf::kMaxTrialLineBytes, 'x') + "\n");
    CHECK_THROWS_WITH(vf::read_trial_list(list, index), Catch::Contains("t.txt:2: line of") &&
                                                            Catch::Contains("longer than"));
  }
  SECTION("a file larger than the bound is refused before it is read") {
    melforge::test::write_text(list, "1 id1/a/1.wav id1/b/2.wav\n");
    CHECK_THROWS_AS(vf::read_trial_list(list, index, {}, 10), FormatError);
    std::filesystem::resize_file(list, vf::kMaxTrialListBytes + 1);
    CHECK_THROWS_AS(vf::read_trial_list(list, index), FormatError);
    CHECK_THROWS_WITH(vf::read_trial_list(list, index), Catch::Contains("t.txt"));
  }
  SECTION("a folder is not a trial list") {
    CHECK_THROWS_AS(vf::read_trial_list(d.path(), index), InvalidArgument);
  }
}

TEST_CASE("probit inverts the normal distribution function", "[verification]") {
  const double p = GENERATE(1e-9, 1e-4, 0.001, 0.02, 0.02425, 0.1, 0.5, 0.7, 0.975, 0.999);
  const double x = vf::probit(p);
  CHECK(0.5 * std::erfc(-x / std::sqrt(2.0)) == Approx(p).epsilon(1e-10));
  CHECK(vf::probit(1 - p) == Approx(-x).margin(1e-7));
  CHECK_THROWS_AS(vf::probit(0), InvalidArgument);
  CHECK_THROWS_AS(vf::probit(1), InvalidArgument);
}

TEST_CASE("the DET picture is a PNG of the stated size with the curve, the diagonal and the EER mark",
          "[verification]") {
  std::vector<float> scores;
  std::vector<uint8_t> targets;
  random_trials(300, 5, 0, scores, targets);
  const auto det = vf::det_curve(scores, targets);
  const double eer = vf::error_rates(scores, targets).eer;
  melforge::test::TempDir d;
  const auto path = d / "det.png";
  vf::write_det_png(path, det, eer);
  std::ifstream in(path, std::ios::binary);
  const std::string png((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const melforge::RgbImage img = vf::det_image(det, eer);
  CHECK(png == melforge::encode_png(img));
  REQUIRE(png.size() > 33);
  CHECK(png.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  CHECK(png.substr(12, 4) == "IHDR");
  auto be32 = [&](std::size_t at) {
    return (uint32_t{static_cast<uint8_t>(png[at])} << 24) | (uint32_t{static_cast<uint8_t>(png[at + 1])} << 16) |
           (uint32_t{static_cast<uint8_t>(png[at + 2])} << 8) | uint32_t{static_cast<uint8_t>(png[at + 3])};
  };
  CHECK(be32(16) == vf::kDetImageSize);
  CHECK(be32(20) == vf::kDetImageSize);

  auto pixel = [&](int64_t x, int64_t y) {
    const auto at = static_cast<std::size_t>((y * img.width + x) * 3);
    return std::array{img.rgb[at], img.rgb[at + 1], img.rgb[at + 2]};
  };
  int64_t blue = 0, red = 0;
  for (int64_t y = 0; y < img.height; ++y)
    for (int64_t x = 0; x < img.width; ++x) {
      blue += pixel(x, y) == std::array<uint8_t, 3>{20, 70, 200};
      red += pixel(x, y) == std::array<uint8_t, 3>{220, 30, 30};
    }
  CHECK(blue > 100);
  CHECK(red == 49);
  const int64_t c = img.width / 2;
  CHECK(pixel(c, img.height - 1 - c) == std::array<uint8_t, 3>{150, 150, 150});
  CHECK(pixel(0, 0) == std::array<uint8_t, 3>{255, 255, 255});
  CHECK_THROWS_AS(vf::write_det_png(d / "missing" / "det.png", det, eer), IoError);
}

}  // namespace melforge_test_verification
