// Small file helpers shared by the engine: whole-file reads, JSON files, atomic writes of a file
// and of a whole directory, fsync.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace tmx {

// Opens `path` read-only (O_CLOEXEC) and checks that it is a regular file: a FIFO, device,
// socket or directory is a tmx::Error naming the path, since reading one could block forever
// or never end. Never blocks on a FIFO. Returns the descriptor; the caller closes it.
int open_regular_file(const std::string& path);

// Reads a whole regular file; throws tmx::Error naming the path when it cannot.
std::string read_file(const std::string& path);

// Parses a JSON file; throws tmx::Error naming the path and the parse position.
nlohmann::json read_json_file(const std::string& path);

// Writes `data` to `path` atomically: a temporary file in the same directory, fsync, rename.
// A reader sees either the old file or the new one, never a partial write.
void write_file_atomic(const std::string& path, std::string_view data);

// A file written in pieces and put in place atomically: the bytes go to a temporary sibling
// (PATH.tmp.PID); commit() fsyncs it and renames it onto `path`. Destroyed without commit() (an
// error, an interruption), it removes the temporary file, so no half file ever has the final name.
class AtomicFileWriter {
  public:
    explicit AtomicFileWriter(std::string path);
    ~AtomicFileWriter();
    AtomicFileWriter(const AtomicFileWriter&) = delete;
    AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

    void write(const void* data, size_t n);
    void write(std::string_view data) { write(data.data(), data.size()); }
    uint64_t bytes_written() const { return written_; }
    void commit();
    const std::string& path() const { return path_; }

  private:
    std::string path_, tmp_;
    int fd_ = -1;
    uint64_t written_ = 0;
};

// Reads exactly n bytes at `offset` of an open file; a short file is a tmx::Error naming `path`.
void read_exact_at(int fd, void* out, size_t n, uint64_t offset, const std::string& path);

// Flushes `path` (a file or a directory) to disk: open, fsync, close. Best effort: a path that
// cannot be opened, or a filesystem that cannot fsync a directory, is no error.
void fsync_path(const std::string& path);

// What replace_directory does when `dir` exists and the filesystem cannot exchange two
// directories atomically (renameat2 RENAME_EXCHANGE fails with EINVAL or ENOSYS, e.g. NFS).
enum class WithoutExchange {
    Fail,       // a tmx::Error: "DIR: cannot replace the WHAT: Invalid argument"
    MoveAside,  // `dir` is renamed to DIR.old-PID, then `tmp` to `dir` (the old one is put
                // back if that fails): never a mix of the two, but for a moment no `dir` at all
};

// Moves the finished directory `tmp` (a sibling of `dir`, its files already fsynced) to `dir`,
// so that a reader sees the old directory or the new one, never a mix, and the result survives
// a crash: fsyncs `tmp`; renames it to `dir` when `dir` does not exist, else exchanges the two
// atomically; then fsyncs the parent of `dir`. Returns the directory that now holds the previous
// contents, for the caller to remove ("" when `dir` did not exist). Errors are tmx::Errors
// naming `dir`, with `what` naming its contents: "DIR: cannot move the WHAT into place: ...",
// "DIR: cannot replace the WHAT: ...".
std::string replace_directory(const std::string& tmp, const std::string& dir,
                              const std::string& what, WithoutExchange without_exchange);

}  // namespace tmx
