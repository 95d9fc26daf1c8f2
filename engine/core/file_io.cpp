#include "engine/core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/core/errors.h"

namespace tmx {

namespace {

const char* file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "of an unknown kind";
}

}  // namespace

int open_regular_file(const std::string& path) {
    // O_NONBLOCK: opening a FIFO without a writer would otherwise wait forever.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        throw Error(path + ": cannot stat: " + std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        throw Error(path + ": is " + file_kind(st.st_mode) + ", expected a regular file");
    }
    // Regular files never block; clear the flag so that reads behave as usual.
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

std::string read_file(const std::string& path) {
    const int fd = open_regular_file(path);
    std::string out;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
    char buf[1 << 16];
    while (true) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n == 0) break;
        if (n < 0) {
            if (errno == EINTR) continue;
            const int err = errno;
            ::close(fd);
            throw Error(path + ": read error: " + std::strerror(err));
        }
        out.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return out;
}

nlohmann::json read_json_file(const std::string& path) {
    std::string text = read_file(path);
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        // parse_error, and out_of_range for a number too large for a double (1e400).
        throw Error(path + ": not valid JSON (" + e.what() + ")");
    }
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
    // Two writers of one path in one process (threads) must not share a temporary file.
    static std::atomic<uint64_t> serial{0};
    tmp_ = path_ + ".tmp." + std::to_string(::getpid());
    if (const uint64_t n = serial++; n > 0) tmp_ += "." + std::to_string(n);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(tmp_ + ": cannot create: " + std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
    if (fd_ >= 0) {
        ::close(fd_);
        ::unlink(tmp_.c_str());
    }
}

void AtomicFileWriter::write(const void* data, size_t n) {
    if (fd_ < 0) throw Error(path_ + ": write after the file was committed");
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd_, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            throw Error(tmp_ + ": write failed: " + std::strerror(errno));
        }
        p += w;
        n -= static_cast<size_t>(w);
        written_ += static_cast<uint64_t>(w);
    }
}

void AtomicFileWriter::commit() {
    const int fd = fd_;
    fd_ = -1;
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        const int err = errno;
        ::unlink(tmp_.c_str());
        throw Error(tmp_ + ": cannot flush: " + std::strerror(err));
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp_.c_str());
        throw Error(path_ + ": cannot rename into place: " + std::strerror(err));
    }
    // The rename itself survives a crash once the directory is flushed.
    const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
    fsync_path(parent.empty() ? "." : parent.string());
}

void write_file_atomic(const std::string& path, std::string_view data) {
    AtomicFileWriter out(path);
    out.write(data);
    out.commit();
}

void read_exact_at(int fd, void* out, size_t n, uint64_t offset, const std::string& path) {
    char* p = static_cast<char*>(out);
    while (n > 0) {
        const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
        if (r < 0) {
            if (errno == EINTR) continue;
            throw Error(path + ": read failed: " + std::strerror(errno));
        }
        if (r == 0) throw Error(path + ": truncated (the file ended while reading)");
        p += r;
        n -= static_cast<size_t>(r);
        offset += static_cast<uint64_t>(r);
    }
}

void fsync_path(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
}

std::string replace_directory(const std::string& tmp, const std::string& dir,
                              const std::string& what, WithoutExchange without_exchange) {
    namespace fs = std::filesystem;
    fsync_path(tmp);
    std::string previous;
    std::error_code ec;
    if (!fs::exists(dir, ec)) {
        fs::rename(tmp, dir, ec);
        if (ec) throw Error(dir + ": cannot move the " + what + " into place: " + ec.message());
    } else if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
        previous = tmp;  // now holds the previous contents
    } else if ((errno == EINVAL || errno == ENOSYS) &&
               without_exchange == WithoutExchange::MoveAside) {
        // No atomic exchange on this filesystem: move the old directory aside first.
        const std::string old = dir + ".old-" + std::to_string(::getpid());
        if (std::rename(dir.c_str(), old.c_str()) != 0) {
            const int err = errno;
            throw Error(dir + ": cannot replace the " + what + ": " + std::strerror(err));
        }
        if (std::rename(tmp.c_str(), dir.c_str()) != 0) {
            const int err = errno;
            std::rename(old.c_str(), dir.c_str());
            throw Error(dir + ": cannot replace the " + what + ": " + std::strerror(err));
        }
        previous = old;
    } else {
        const int err = errno;
        throw Error(dir + ": cannot replace the " + what + ": " + std::strerror(err));
    }
    const fs::path parent = fs::path(dir).parent_path();
    fsync_path(parent.empty() ? "." : parent.string());
    return previous;
}

}  // namespace tmx
