#include "train/run.h"

#include "melforge/common/errors.h"
#include "train/rng_state.h"
#include "train/run_folder.h"

namespace fs = std::filesystem;

namespace melforge::trainer {

void Run::resolve_resume() {
  TrainConfig& c = cfg_;
  if (c.train.resume.empty()) {
    run_dir_ = c.train.out;
    if (!writer()) return;
    check_run_dir(run_dir_, c.train.overwrite);
    lock_ = lock_run_dir(run_dir_);
    check_run_dir(run_dir_, c.train.overwrite);
    return;
  }
  const fs::path ckpt = resume_checkpoint(c.train.resume);
  if (!fs::exists(ckpt)) throw IoError("--resume: no checkpoint at " + ckpt.string());
  run_dir_ = run_dir_of(ckpt);
  if (writer()) lock_ = lock_run_dir(run_dir_);
  if (!c.train.out.empty() && fs::absolute(c.train.out).lexically_normal() != run_dir_.lexically_normal() &&
      !(fs::exists(c.train.out) && fs::equivalent(c.train.out, run_dir_)))
    throw InvalidArgument("--out '" + c.train.out.string() + "' differs from the run folder of --resume ('" +
                          run_dir_.string() + "')");
  resume_from_ = load_checkpoint(ckpt);
  const int64_t saved_world = resume_from_->state.value("world_size", int64_t{1});
  if (saved_world != world_)
    throw InvalidArgument("--resume: " + ckpt.string() + " was written by a job of " + std::to_string(saved_world) +
                          " process(es); resume it with the same world size (this job has " +
                          std::to_string(world_) + "): the shuffle shards and the per-rank random states depend "
                          "on it");
  TrainConfig saved = TrainConfig::from_json(resume_from_->config);
  if (!c.data.data.empty()) saved.data.data = c.data.data;
  saved.data.stream.h5_cache = c.data.stream.h5_cache;
  if (c.data.stream.stream != "auto" && c.data.stream.stream != saved.data.stream.stream) {
    log_.warn("--stream " + c.data.stream.stream + " replaces the run's '" + saved.data.stream.stream +
              "': the shuffle order changes from here on, so the result will differ from an uninterrupted run");
    saved.data.stream.stream = c.data.stream.stream;
  }
  saved.runtime = c.runtime;
  saved.dist = c.dist;
  saved.loader.prefetch = c.loader.prefetch;
  saved.loader.gpu_mem = c.loader.gpu_mem;
  saved.train.profile_steps = c.train.profile_steps;
  saved.train.resume = c.train.resume;
  saved.train.out = run_dir_;
  saved.validate();
  if (saved.data.data.empty()) throw InvalidArgument("--resume: the checkpoint names no dataset; pass --data");
  cfg_ = std::move(saved);
  log_.info("resuming " + run_dir_.string() + " after epoch " + std::to_string(resume_from_->epoch) +
            " with its saved configuration");
}

void Run::restore(const Checkpoint& c) {
  const std::string what = resume_checkpoint(cfg_.train.resume).string();
  load_state_dict(*model_, c.model, what);
  opt_->load_state_dict(c.optimizer);
  scaler_->load_state_dict(c.scaler);
  if (c.rng_state.defined()) set_rng_state(c.rng_state);
  if (c.cuda_rng_state.defined() && s_.device.is_cuda()) set_rng_state(c.cuda_rng_state, s_.device);
  restore_rank_rng(c);
  if (c.cuda_rng_state.defined() != s_.device.is_cuda())
    log_.warn("--resume: the checkpoint was written on " + std::string(c.cuda_rng_state.defined() ? "CUDA" : "the CPU") +
              " and the run continues on " + s_.device.str() + ": the random draws from here on differ from an "
              "uninterrupted run");
  epoch_ = c.epoch;
  step_ = c.step;
  const auto& st = c.state;
  best_epoch_ = st.value("best_epoch", int64_t{0});
  best_value_ = st.contains("best_value") && st["best_value"].is_number() ? st["best_value"].get<double>() : 0.0;
  bad_epochs_ = st.value("bad_epochs", int64_t{0});
  early_stopped_ = st.value("early_stopped", false);
}

Checkpoint Run::make_checkpoint() const {
  Checkpoint c;
  c.version = kCheckpointVersion;
  c.model_config = model_config();
  c.config = cfg_.to_json();
  c.mel = data_.info.to_json();
  c.class_names = data_.class_names;
  c.positive_class = s_.positive_name;
  c.positive_index = s_.positive_index;
  c.epoch = epoch_;
  c.step = step_;
  c.model = state_dict(*model_);
  c.optimizer = opt_->state_dict();
  c.scaler = scaler_->state_dict();
  c.scheduler = schedule_->to_json();
  c.rng_state = rng_state();
  if (s_.device.is_cuda()) c.cuda_rng_state = rng_state(s_.device);
  c.state = {{"best_metric", cfg_.train.best_metric},
             {"best_epoch", best_epoch_},
             {"best_value", best_value_},
             {"bad_epochs", bad_epochs_},
             {"early_stopped", early_stopped_},
             {"pos_weight", s_.pos_weight},
             {"steps_per_epoch", steps_per_epoch_},
             {"loader_seed", cfg_.model.seed}};
  if (world_ > 1) c.state["world_size"] = world_;
  return c;
}

nlohmann::json Run::gather_rank_rng() {
  nlohmann::json mine = {{"cpu", to_hex(rng_state())}};
  if (s_.device.is_cuda()) mine["cuda"] = to_hex(rng_state(s_.device));
  const auto all = group_->gather_bytes("rng/" + std::to_string(epoch_), mine.dump());
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : all) out.push_back(nlohmann::json::parse(s));
  return out;
}

void Run::restore_rank_rng(const Checkpoint& c) {
  if (rank_ == 0 || !c.state.contains("rank_rng")) return;
  const auto& all = c.state["rank_rng"];
  if (!all.is_array() || static_cast<int>(all.size()) != world_)
    throw FormatError("--resume: the checkpoint's per-rank random states do not match " + std::to_string(world_) +
                      " ranks");
  const auto& mine = all[static_cast<std::size_t>(rank_)];
  set_rng_state(from_hex(mine.at("cpu").get<std::string>()));
  if (mine.contains("cuda") && s_.device.is_cuda())
    set_rng_state(from_hex(mine.at("cuda").get<std::string>()), s_.device);
}

}  // namespace melforge::trainer
