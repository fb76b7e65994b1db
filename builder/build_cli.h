#pragma once
/// melforge-build's command line as a library, so that `melforge-build` and the Python package's `melforge.build`
/// parse the same flags the same way: the option groups, the --config INI file and the conventions of
/// melforge/common/flags.h (underscore spellings and aliases such as --n_fft and --norm, "did you mean" for an
/// unknown flag).
#include <iosfwd>
#include <string>
#include <vector>

#include "build_options.h"

namespace melforge::builder {

/// Adds the option groups of a build (--help and --config, input/output/running, decode, mel, segmentation) to
/// `all`, bound to `config` and `config_file`.
void add_build_groups(boost::program_options::options_description& all, BuildConfig& config,
                      std::string& config_file);

/// Parses `args` (the command line without the program name) and then the --config file they name (the command line
/// wins) into the variables bound by `all`, after rewriting flag and key spellings to the registered ones
/// (canonical_args, canonical_config). Returns false after writing the help to `help` when --help was given. Throws
/// boost::program_options::error for an unknown flag (naming the nearest one) or a bad value, InvalidArgument for
/// an unreadable --config file. With `config` (the one `all` is bound to), records whether --split was given
/// (BuildOptions::split_given) and applies the front-end (apply_front_end: --features fbank derives the FFT geometry;
/// a mel-only flag with fbank, or an fbank flag with mel, is refused with InvalidArgument). Without `config` an fbank
/// configuration keeps mel's geometry, which BuildConfig::validate refuses.
bool parse_build_args(const std::vector<std::string>& args, const boost::program_options::options_description& all,
                      std::ostream& help, BuildConfig* config = nullptr);

}  // namespace melforge::builder
