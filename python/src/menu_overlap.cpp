// The host-memory half of menu_overlap.def (port.hpp). The menu is split over several translation
// units so that a parallel build compiles it in parts.
#include "port.hpp"

#define GFLOW_MENU(id, ...) GFLOW_PYTHON_COMPOSITION(id, __VA_ARGS__);
#include "menu_overlap.def"
