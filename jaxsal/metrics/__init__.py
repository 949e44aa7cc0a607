"""Is this map trustworthy? Sanity checks (parameter randomisation) and insertion/deletion fidelity.

    res = jaxsal.metrics.sanity_check(model, params, obs, method="rise", key=key)
    ins = jaxsal.metrics.insertion(model.apply, params, obs, maps, substrate="black")
    obj = jaxsal.metrics.object_attribution(maps, boxes)   # share of attribution per game object class
    eff = jaxsal.metrics.object_effects(model.apply, params, obs, boxes)   # Q drop when each class is removed
    dis = jaxsal.metrics.displacement_effects(model.apply, params, obs, moved_obs)   # Q change when an object moves
    fs = jaxsal.metrics.frame_shares(per_frame_maps, 4)    # share of attribution per stacked frame
"""
from jaxsal.metrics.displacement import DisplacementEffects, MapFollows, displacement_effects, map_follows
from jaxsal.metrics.effects import ObjectEffects, effect_agreement, object_effects
from jaxsal.metrics.fidelity import deletion, gaussian_blur, insertion
from jaxsal.metrics.frames import age_centroid, frame_shares, newest_share
from jaxsal.metrics.object_shares import ObjectShares, object_attribution, object_pointing
from jaxsal.metrics.sanity import cascade, group_norms, randomize_layers, sanity_check
from jaxsal.metrics.similarity import (hog_features, hog_pearson, similarity, spearman, ssim,
                                       ssim_flat)

__all__ = ["sanity_check", "insertion", "deletion", "similarity", "spearman", "ssim", "ssim_flat", "hog_pearson",
           "hog_features", "gaussian_blur", "cascade", "group_norms", "randomize_layers", "object_attribution",
           "object_pointing", "ObjectShares", "frame_shares", "newest_share", "age_centroid",
           "object_effects", "effect_agreement", "ObjectEffects", "displacement_effects", "map_follows",
           "DisplacementEffects", "MapFollows"]
