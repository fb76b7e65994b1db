#include "eval/batching.h"

#include <algorithm>
#include <future>
#include <utility>

#include "data/dataset.h"
#include "melforge/common/errors.h"
#include "models/model.h"

namespace melforge::trainer {

namespace views = data::views;

nlohmann::json Coverage::to_json() const {
  return {{"view", view},
          {"example_frames", example_frames},
          {"clips", clips},
          {"clips_scored", clips_scored},
          {"examples", examples},
          {"padded_frames", padded_frames},
          {"frames", frames},
          {"frames_covered", frames_covered},
          {"fraction", fraction()},
          {"seconds", seconds},
          {"seconds_scored", seconds_scored},
          {"batches", batches}};
}

views::ViewOptions evaluation_view_options(const views::ViewOptions& trained, const Split& split,
                                           const std::string& model_kind) {
  views::ViewOptions o = trained;
  if (split.meta.schema_version < 3) {
    o.view = "tiles";
    return o;
  }
  if (is_speaker_model(model_kind)) {
    o.view = "clips";
  } else if (o.view == "crops") {
    o.view = "tiles";
    o.tile_seconds = o.crop_seconds;
    o.tile_hop = 0;
  }
  return o;
}

namespace {

/// Fills the plan's coverage from its examples (clip by clip, by start within a clip) and batches.
void measure(const Split& split, std::string_view view, int64_t example_frames, EvalPlan& plan) {
  Coverage& c = plan.coverage;
  c.view = std::string(view);
  c.batches = static_cast<int64_t>(plan.batches.size());
  c.example_frames = example_frames;
  c.clips = split.files();
  c.examples = static_cast<int64_t>(plan.examples.size());
  const double rate = static_cast<double>(split.info.sample_rate);
  for (int64_t f = 0; f < c.clips; ++f) {
    c.frames += split.clip_frames(f);
    c.seconds += static_cast<double>(split.meta.num_samples[static_cast<std::size_t>(f)]) / rate;
  }
  int64_t clip = -1, reached = 0;
  for (const views::Example& e : plan.examples) {
    if (e.clip != clip) {
      clip = e.clip;
      reached = 0;
      ++c.clips_scored;
      c.seconds_scored += static_cast<double>(split.meta.num_samples[static_cast<std::size_t>(clip)]) / rate;
    }
    const int64_t end = e.repeat ? e.clip_frames : e.start + e.real;
    c.frames_covered += std::max<int64_t>(0, end - std::max(e.start, reached));
    reached = std::max(reached, end);
  }
  for (const views::ClipBatch& b : plan.batches)
    for (const int64_t i : b.members) c.padded_frames += b.length - plan.examples[static_cast<std::size_t>(i)].real;
}

}  // namespace

EvalPlan plan_evaluation(const Split& split, const views::ViewOptions& options, int64_t batch_size) {
  if (batch_size < 1) throw InvalidArgument("--eval-batch-size must be >= 1 (got " + std::to_string(batch_size) + ")");
  const std::unique_ptr<views::View> view = split_view(split, options, /*evaluation=*/true);
  EvalPlan plan;
  plan.examples = view->examples(split.clip_frame_counts(), /*seed=*/0, /*epoch=*/0);
  const bool whole = view->name() == "clips";
  const int64_t frames = whole ? 0 : example_frames(options, split);
  if (whole) {
    plan.batches = views::batch_by_length(plan.examples, frame_rate(split.info).frames(options.clip_batch_seconds));
  } else {
    const auto E = static_cast<int64_t>(plan.examples.size());
    for (int64_t first = 0; first < E; first += batch_size) {
      views::ClipBatch b;
      for (int64_t i = first; i < std::min(E, first + batch_size); ++i) {
        b.members.push_back(i);
        b.length = std::max(b.length, plan.examples[static_cast<std::size_t>(i)].length);
      }
      plan.batches.push_back(std::move(b));
    }
  }
  measure(split, view->name(), frames, plan);
  if (plan.coverage.clips_scored != plan.coverage.clips)
    throw FormatError("split '" + split.name + "' (" + split.path.string() + "): the " + plan.coverage.view +
                      " view gives " + std::to_string(plan.coverage.clips - plan.coverage.clips_scored) + " of " +
                      std::to_string(plan.coverage.clips) + " clips no example; every clip must be scored");
  return plan;
}

std::vector<int64_t> crop_starts(int64_t clip_frames, int64_t crop, int64_t count) {
  if (count < 1 || crop < 1)
    throw InvalidArgument("crop_starts: count and crop must be >= 1 (got " + std::to_string(count) + ", " +
                          std::to_string(crop) + ")");
  if (clip_frames <= crop) return {0};
  std::vector<int64_t> out;
  out.reserve(static_cast<std::size_t>(count));
  for (int64_t i = 0; i < count; ++i) out.push_back(count == 1 ? 0 : i * (clip_frames - crop) / (count - 1));
  return out;
}

EvalPlan plan_crops(const Split& split, int64_t crop_frames, int64_t count, double clip_batch_seconds) {
  if (count < 1 || crop_frames < 1)
    throw InvalidArgument("--embed-crops: " + std::to_string(count) + " crops of " + std::to_string(crop_frames) +
                          " frames: both must be >= 1");
  EvalPlan plan;
  for (int64_t f = 0; f < split.files(); ++f) {
    const int64_t n = split.clip_frames(f);
    const int64_t length = std::min(n, crop_frames);
    for (const int64_t start : crop_starts(n, crop_frames, count))
      plan.examples.push_back({f, start, length, length, n, false});
  }
  plan.batches = views::batch_by_length(plan.examples, frame_rate(split.info).frames(clip_batch_seconds));
  measure(split, "embed-crops", crop_frames, plan);
  return plan;
}

void for_each_batch(const Split& split, const EvalPlan& plan, const std::function<void(const ExampleBatch&)>& fn) {
  const auto gather = [&split, &plan](std::size_t b) {
    const views::ClipBatch& batch = plan.batches[b];
    std::vector<views::Example> rows;
    rows.reserve(batch.members.size());
    for (const int64_t i : batch.members) rows.push_back(plan.examples[static_cast<std::size_t>(i)]);
    return gather_examples(split, rows, batch.length);
  };
  if (plan.batches.empty()) return;
  std::future<ExampleBatch> ahead = std::async(std::launch::async, gather, std::size_t{0});
  for (std::size_t b = 0; b < plan.batches.size(); ++b) {
    const ExampleBatch batch = ahead.get();
    if (b + 1 < plan.batches.size()) ahead = std::async(std::launch::async, gather, b + 1);
    fn(batch);
  }
}

ModelOutput forward_batch(Classifier& model, const ExampleBatch& batch, at::Device device) {
  if (model.fixed_frames() > 0) return model.forward(batch.x.to(device));
  return model.forward(batch.x.to(device), batch.lengths.to(device));
}

int64_t model_frames(const Classifier& model) {
  const nlohmann::json j = model.config_json();
  return j.contains("n_frames") && j["n_frames"].is_number_integer() ? j["n_frames"].get<int64_t>() : 0;
}

void check_model_frames(const Classifier& model, const EvalPlan& plan) {
  const int64_t trained = model_frames(model);
  const Coverage& c = plan.coverage;
  if (c.view == "tiles" && trained > 0 && trained != c.example_frames)
    throw InvalidArgument("evaluation tiles of " + std::to_string(c.example_frames) + " frames, but the model (" +
                          model.kind() + ") was built for inputs of " + std::to_string(trained) +
                          " frames: evaluate it through the view it was trained through");
}

}  // namespace melforge::trainer
