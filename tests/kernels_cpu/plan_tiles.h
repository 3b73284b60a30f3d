// moe_plan_tiles' table as the expert kernels read it, for the checks that
// launch them on a plan of their own.
#pragma once
#include <vector>

// The table for experts with these row counts (tiles of at most 8 rows, in
// plan order); *rows gets the total.
static std::vector<int> plan_tiles(const std::vector<int>& counts, int* rows) {
    std::vector<int> tiles = {0};
    *rows = 0;
    for (int e = 0; e < (int)counts.size(); e++)
        if (counts[e] > 0) {
            tiles.insert(tiles.end(), {e, *rows, counts[e]});
            tiles[0]++;
            *rows += counts[e];
        }
    return tiles;
}
