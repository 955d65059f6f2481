/* The smallest program using the installed deltacast C API: it must build with pkg-config
 * (cc consumer.c $(pkg-config --cflags --libs deltacast)) and with CMake's find_package. */
#include <deltacast/deltacast.h>
#include <stdio.h>

int main(void) {
  printf("deltacast %s (%u), %s\n", dc_version_string(), dc_version_number(), dc_status_name(DC_OK));
  return dc_version_number() == DC_VERSION_NUMBER ? 0 : 1;
}
