#pragma once
/// Typed errors thrown by melforge's libraries. Only a `main` turns them into a message and an exit code.
#include <stdexcept>
#include <string>

namespace melforge {

/// Base class of every error melforge throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A parameter or option is invalid. Raised before any work starts.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// A filesystem or HDF5 operation failed (missing folder, full disk, unwritable path).
class IoError : public Error {
 public:
  using Error::Error;
};

/// One input audio file cannot be used. The message names the file and the reason; the builder skips the file.
class AudioError : public Error {
 public:
  using Error::Error;
};

/// A dataset or checkpoint does not have the expected layout, schema or parameters.
class FormatError : public Error {
 public:
  using Error::Error;
};

/// A CUDA runtime or cuFFT call failed. The message names the call, the file and line, and the error string.
class CudaError : public Error {
 public:
  using Error::Error;
};

/// `--strict` was given and a file was skipped.
class StrictError : public Error {
 public:
  using Error::Error;
};

}  // namespace melforge
