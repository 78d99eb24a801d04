//! Drop-ratio control math (G8): from offered load and limit to a smoothed drop ratio.
