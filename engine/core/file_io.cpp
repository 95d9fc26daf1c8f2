#include "engine/core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

void write_file_atomic(const std::string& path, std::string_view data) {
    std::string tmp = path + ".tmp." + std::to_string(::getpid());
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw Error(tmp + ": cannot create: " + std::strerror(errno));
    const char* p = data.data();
    size_t left = data.size();
    while (left > 0) {
        ssize_t n = ::write(fd, p, left);
        if (n < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            ::close(fd);
            ::unlink(tmp.c_str());
            throw Error(tmp + ": write failed: " + std::strerror(err));
        }
        p += n;
        left -= static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        throw Error(tmp + ": cannot flush: " + std::strerror(err));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        int err = errno;
        ::unlink(tmp.c_str());
        throw Error(path + ": cannot rename into place: " + std::strerror(err));
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
