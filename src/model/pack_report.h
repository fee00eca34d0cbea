// The facts `bonsai inspect` reports about a pack, as JSON (the CLI prints it as text or as is):
// format, architecture and hyperparameters, layer kinds, tensor inventory by type with byte totals,
// the Hadamard contract, bytes read per decoded token, and the validation verdict with every problem.
#pragma once
#include <nlohmann/json.hpp>

#include "model/pack.h"

namespace bonsai {

nlohmann::ordered_json inspect_pack(const Pack& pack, const PackCheck& check);

}  // namespace bonsai
