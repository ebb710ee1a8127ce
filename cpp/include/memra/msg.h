// A minimal message builder used instead of std::ostringstream. The extension must not depend on
// iostreams/locales: on the GPU machine's Python (a venv whose process already carries another
// libstdc++), stream extraction crashed inside the locale facets, so memra formats with
// std::to_string and snprintf only.
#pragma once

#include <cstdio>
#include <string>
#include <type_traits>

namespace memra {

class Msg {
 public:
  Msg& operator<<(const std::string& s) { s_ += s; return *this; }
  Msg& operator<<(const char* s) { s_ += s; return *this; }
  Msg& operator<<(char c) { s_ += c; return *this; }
  Msg& operator<<(bool b) { s_ += b ? "true" : "false"; return *this; }
  template <class T, typename std::enable_if<std::is_integral<T>::value, int>::type = 0>
  Msg& operator<<(T v) {
    s_ += std::to_string(v);
    return *this;
  }
  Msg& operator<<(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    s_ += buf;
    return *this;
  }
  Msg& operator<<(float v) { return *this << static_cast<double>(v); }
  std::string str() const { return s_; }

 private:
  std::string s_;
};

}  // namespace memra
