// Linked with every object of tmx_engine and no backend (tests/CMakeLists.txt, WHOLE_ARCHIVE):
// the build fails if the engine refers to any backend's code, so the seam between the engine
// and the backends (docs/design.md#15-layering) is enforced by the linker, not by convention.
int main() {
    return 0;
}
