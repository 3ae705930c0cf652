"""The live runners (Faust worker, replay) and the patches they apply to Faust."""
