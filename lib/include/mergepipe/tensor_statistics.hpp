#pragma once
// The linear form of one tensor for the methods whose coefficients come from its geometry
// (uses_tensor_statistics): slerp, model_stock, karcher and multislerp, each decided from the
// tensor's Gram of θ0 and the deltas (tensor_gram.hpp) with the tensor's resolved parameters.
#include <string_view>

#include "mergepipe/operators.hpp"
#include "mergepipe/tensor_gram.hpp"

namespace mergepipe {

// Throws InputError (naming `tensor`) where the method has no defined result for the data.
OperatorConfig::LinearForm linear_form_from_gram(const OperatorConfig& cfg, const TensorGram& gram,
                                                 std::string_view tensor);

}  // namespace mergepipe
