// A self-contained page of SAFE Ensemble Studio: draws the charts, shows a token's details (rendered in Python,
// kept in <template>s) when it is clicked or Enter is pressed on it, and offers the embedded trace as a file.
// It reads only the page's own data blocks as JSON or text and inserts nothing as markup that Python did not
// render and escape.
(() => {
  const figures = JSON.parse(document.getElementById("safe-figures").textContent);
  const config = { displaylogo: false, responsive: true };
  const draw = (element, key) => {
    const figure = figures[key];
    if (figure) Plotly.react(element, figure.data, figure.layout, config);
  };
  document.querySelectorAll("[data-figure]").forEach((element) => draw(element, element.dataset.figure));

  const pin = (token) => {
    const run = token.closest("[data-run]");
    const shared = run.dataset.details;
    document.querySelectorAll(`[data-details="${shared}"] .tok.pinned`).forEach((t) => t.classList.remove("pinned"));
    token.classList.add("pinned");
    const details = document.getElementById(`${run.dataset.run}-t${token.dataset.i}`);
    document.getElementById(shared).replaceChildren(details.content.cloneNode(true));
    const union = run.dataset.union && document.getElementById(run.dataset.union);
    if (union && details.dataset.point) draw(union, `${run.dataset.run}-u${details.dataset.point}`);
  };
  const pinnable = (event) => event.target.closest("[data-run] .transcript .tok[data-i]");
  document.addEventListener("click", (event) => {
    const token = pinnable(event);
    if (token) pin(token);
  });
  document.addEventListener("keydown", (event) => {
    const token = pinnable(event);
    if (token && (event.key === "Enter" || event.key === " ")) {
      event.preventDefault();
      pin(token);
    }
  });

  const trace = document.getElementById("safe-trace").textContent;
  const link = document.getElementById("trace-link");
  link.href = URL.createObjectURL(new Blob([trace], { type: "application/x-ndjson" }));
})();
