#include "memra/host_memory.h"

#include <cstdio>

namespace memra {

int64_t available_host_bytes() {
  std::FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return -1;
  char line[256];
  long long kb = -1;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    kb = -1;
  }
  std::fclose(f);
  return kb < 0 ? -1 : static_cast<int64_t>(kb) * 1024;
}

}  // namespace memra
