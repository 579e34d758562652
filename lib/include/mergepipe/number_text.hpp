#pragma once
// A number in messages, plans and model cards: printf's %g (6 significant digits).
#include <cstdio>
#include <string>

namespace mergepipe {

inline std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

}  // namespace mergepipe
