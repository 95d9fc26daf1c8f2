// Small file helpers shared by the engine: whole-file reads, JSON files, atomic writes.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

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

}  // namespace tmx
