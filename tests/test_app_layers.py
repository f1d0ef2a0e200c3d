"""The Across layers page in AppTest: heatmaps and shaded text against rollout and flow of the model's attention."""
import numpy as np

from analysis import flow, make_view, rollout
from tests.conftest import decode, figures, heatmaps

COFFEE = "Which do you like better, coffee or tea?"


def lines(fig):
    return np.concatenate([decode(t["z"]).ravel() for t in heatmaps(fig)])


def test_rollout_flow_and_raw_attention_of_one_layer_and_token(new_app, hf_model):
    at = new_app({"layer": "3", "query": "7"}, page="app_pages/layers.py")
    att = hf_model.attend(COFFEE)
    raw_fig, roll_fig, flow_fig, raw_text, roll_text, flow_text = figures(at)
    want_roll, want_flow = rollout(att), flow(att)
    np.testing.assert_allclose(decode(heatmaps(raw_fig)[0]["z"]), att.weights[3].mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(decode(heatmaps(roll_fig)[0]["z"]), want_roll[3], atol=1e-6)
    np.testing.assert_allclose(decode(heatmaps(flow_fig)[0]["z"]), want_flow, atol=1e-6)
    np.testing.assert_allclose(lines(roll_text), want_roll[3][7], atol=1e-6)  # what reaches "coffee"
    np.testing.assert_allclose(lines(flow_text), want_flow[7], atol=1e-6)
    assert "“coffee”" in roll_text["layout"]["title"]["text"]

    at.slider(key="residual").set_value(0.0).run()  # no skip connection
    np.testing.assert_allclose(decode(heatmaps(figures(at)[1])[0]["z"]), rollout(att, residual=0.0)[3], atol=1e-6)
    assert at.query_params["residual"] == "0.0"
    at.slider(key="layer").set_value(5).run()  # the layer slider moves rollout and raw attention together
    raw_fig, roll_fig = figures(at)[:2]
    np.testing.assert_allclose(decode(heatmaps(raw_fig)[0]["z"]), att.weights[5].mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(decode(heatmaps(roll_fig)[0]["z"]), rollout(att, residual=0.0)[5], atol=1e-6)


def test_view_options_and_a_text_beyond_flows_limit(new_app, hf_model):
    at = new_app({"hide_special": "true", "layer": "5"}, page="app_pages/layers.py")
    v = make_view(hf_model.attend(COFFEE), hide_special=True)
    np.testing.assert_allclose(decode(heatmaps(figures(at)[1])[0]["z"]), rollout(v)[5], atol=1e-6)
    text = " ".join(["word"] * 80)
    at.text_area(key="text").input(text).run()
    assert not at.exception and not at.error
    assert "at most 64 tokens; this one has 80" in at.info[0].value
    assert len(figures(at)) == 4  # two heatmaps and two shaded texts, no flow


def test_the_layer_carries_over_between_the_slider_and_other_pages_pickers(app):
    app.selectbox(key="layer").set_value(3).run()
    app.switch_page("app_pages/layers.py").run()
    assert app.slider(key="layer").value == 3 and not app.exception and not app.warning
    app.slider(key="layer").set_value(4).run()
    app.switch_page("app_pages/explore.py").run()
    assert app.selectbox(key="layer").value == 4 and not app.exception
