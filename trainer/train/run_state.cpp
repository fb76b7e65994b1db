#include "train/run.h"

#include "melforge/common/errors.h"
#include "melforge/common/utf8.h"
#include "train/overrides.h"
#include "train/rng_state.h"
#include "train/run_folder.h"
#include "util.h"

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
  if (!fs::exists(ckpt)) {
    const fs::path best = ckpt.parent_path() / "best.pt";
    if (ckpt.filename() == "last.pt" && fs::exists(best))
      throw IoError("--resume: no checkpoint at " + utf8::for_terminal(ckpt.string()) + ", but " +
                    utf8::for_terminal(best.string()) + " exists (the run's last.pt was removed, or the run stopped "
                    "before writing it): resume from the best epoch with --resume " +
                    utf8::for_terminal(best.string()) + " (the epochs after it are trained again)");
    throw IoError("--resume: no checkpoint at " + utf8::for_terminal(ckpt.string()));
  }
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
  TrainConfig saved = resume_config(resume_from_->config, c, ckpt.string(), log_);
  saved.train.out = run_dir_;
  saved.validate();
  if (saved.data.data.empty()) throw InvalidArgument("--resume: the checkpoint names no dataset; pass --data");
  check_extension(saved);
  cfg_ = std::move(saved);
  std::string from_flags;
  for (const auto& flag : cfg_.given)
    if (resume_honoured_flags().count(flag)) from_flags += (from_flags.empty() ? " --" : ", --") + flag;
  log_.info("resuming " + run_dir_.string() + " after epoch " + std::to_string(resume_from_->epoch) + " of " +
            std::to_string(cfg_.train.epochs) + " with its saved configuration" +
            (from_flags.empty() ? "" : " and" + from_flags + " from the command line"));
}

void Run::check_extension(const TrainConfig& merged) const {
  const Checkpoint& c = *resume_from_;
  if (merged.train.epochs < c.epoch)
    throw InvalidArgument("--epochs " + std::to_string(merged.train.epochs) + ": the run of " +
                          resume_checkpoint(merged.train.resume).string() + " has completed " +
                          std::to_string(c.epoch) + " epochs already");
  const int64_t bad = c.state.value("bad_epochs", int64_t{0});
  const bool stopped = merged.train.patience > 0 && bad >= merged.train.patience;
  if (stopped && merged.given.count("epochs") && merged.train.epochs > c.epoch)
    throw InvalidArgument("--epochs " + std::to_string(merged.train.epochs) + ": the run stopped early after epoch " +
                          std::to_string(c.epoch) + " (" + std::to_string(bad) +
                          " epochs without improvement); give --patience above " + std::to_string(bad) +
                          " (or 0) to train on");
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
  early_stopped_ = cfg_.train.patience > 0 && bad_epochs_ >= cfg_.train.patience && epoch_ < cfg_.train.epochs;
}

void Run::check_init_weights(const Dataset& meta) {
  const std::string what = "--init-from '" + cfg_.train.init_from.string() + "'";
  init_ = load_init_weights(cfg_.train.init_from);
  const bool reset = cfg_.train.reset_heads;
  const nlohmann::json mine = make_model(cfg_.model, model_info_, meta.num_classes())->config_json();
  if (const std::string diff = model_config_difference(init_->model_config, mine); !diff.empty())
    throw InvalidArgument(what + ": its model differs from this run's: " + diff +
                          "; give the same --model, --hidden, --rnn and --rnn-hidden and a dataset of the same mel "
                          "shape (the architecture is not taken from the weights)");
  if (reset) return;
  if (init_->class_names.empty()) {
    log_.warn(what + " names no classes (a state dict without export's JSON beside it): the heads are loaded by "
              "shape only");
    return;
  }
  if (init_->class_names != meta.class_names)
    throw InvalidArgument(what + " was trained on the classes " + join(init_->class_names) + ", the dataset has " +
                          join(meta.class_names) + ": give --reset-heads to start the classification and "
                          "detection heads afresh");
  if (!init_->positive_class.empty() && init_->positive_class != s_.positive_name)
    throw InvalidArgument(what + "'s detection head detects '" + init_->positive_class + "', this run's '" +
                          s_.positive_name + "': give --positive-class " + init_->positive_class +
                          ", or --reset-heads to start the heads afresh");
}

void Run::apply_init_weights() {
  const std::string what = "--init-from '" + cfg_.train.init_from.string() + "'";
  const std::vector<std::string> skip = cfg_.train.reset_heads ? head_prefixes() : std::vector<std::string>{};
  const std::size_t copied = load_matching(*model_, init_->model, skip, what);
  const TensorMap loaded = state_dict(*model_);
  input_mean_ = loaded.at("input_mean").item<double>();
  input_std_ = loaded.at("input_std").item<double>();
  log_.info(fmt("initialised from %s (%s, %zu tensors%s; input normalisation mean %g, std %g)",
                cfg_.train.init_from.string().c_str(), init_->kind.c_str(), copied,
                cfg_.train.reset_heads ? ", heads re-initialised" : "", input_mean_, input_std_));
  init_.reset();
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
  if (!dataset_identity_.is_null()) c.state["dataset"] = dataset_identity_;
  if (!dataset_changes_.empty()) c.state["dataset_changes"] = dataset_changes_;
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
